#!/bin/sh
# The GPU check's second half, run on the machine with the GPU, from what gpu_prepare.sh wrote:
# IREE's runtime and topos installed from .whl/ into a folder of their own, then gpu_check.py
# serving every module from the compile cache .gpu-cache/ (no compiler needed there), then
# benchmarks/transfers.py on the same cache.
#
# Run: sh benchmarks/gpu_run.sh [gpu_check.py options, the same --target, --dtypes and --models as prepared]
# Environment: PYTHON (default python3), SITE (where the wheels go, default /tmp/topos-site).
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/topos-site}
if [ ! -d .whl ] || [ ! -d .gpu-cache ]; then
    echo "gpu_run.sh: .whl/ or .gpu-cache/ is missing: run sh benchmarks/gpu_prepare.sh where IREE's compiler is" >&2
    exit 2
fi
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
# Then what one step's host transfers cost there (benchmarks/transfers.py), on the same --target,
# unpinned as gpu_check.py runs: the GPU driver's own threads need CPUs besides Python's.
TARGET=cuda
previous=
for option in "$@"; do
    [ "$previous" = "--target" ] && TARGET=$option
    case $option in --target=*) TARGET=${option#--target=} ;; esac
    previous=$option
done
status=0
PYTHONPATH="$SITE" PYTHONUNBUFFERED=1 "$PY" benchmarks/gpu_check.py --cache .gpu-cache "$@" || status=$?
echo
PYTHONPATH="$SITE" PYTHONUNBUFFERED=1 "$PY" benchmarks/transfers.py --target "$TARGET" --cache .gpu-cache --threads 2 || status=$?
exit $status
