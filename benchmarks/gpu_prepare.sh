#!/bin/sh
# The GPU check's first half, run here, where IREE's compiler is: it needs no GPU.
#
# The machine with the GPU has Python 3.12, NumPy and jax with CUDA, but no IREE, and the
# compiler's wheel (84 MB) is larger than what may travel to it (64 MiB). So the modules are
# compiled here, and only IREE's runtime (15 MB) travels. Written in the repository's root
# (both ignored by git):
#   .whl/        iree-base-runtime for the device's Python, and a wheel of this topos
#   .gpu-cache/  a compile cache holding every module gpu_check.py runs, compiled for --target
# Then, on the machine with the GPU: sh benchmarks/gpu_run.sh (docs/performance.md, "On a GPU").
#
# Run: sh benchmarks/gpu_prepare.sh [gpu_check.py options: --target cuda --dtypes f32,bf16 --models ...]
# Environment: PYTHON (default .venv/bin/python), DEVICE_PYTHON (default 3.12).
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DEVICE_PYTHON=${DEVICE_PYTHON:-3.12}
RUNTIME=$("$PY" -c "from importlib.metadata import version; print(version('iree-base-runtime'))")
rm -rf .whl .gpu-cache
# The runtime of the compiler's own release: a runtime loads only its release's modules.
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$DEVICE_PYTHON" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    -d .whl "iree-base-runtime==$RUNTIME"
# A wheel of this very tree: the cache's keys hold a digest of topos's source.
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl .
"$PY" benchmarks/gpu_check.py --prepare .gpu-cache "$@"
du -sh .whl .gpu-cache
echo "next, on the machine with the GPU (carry .whl and .gpu-cache): sh benchmarks/gpu_run.sh"
