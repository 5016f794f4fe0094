"""XLA as a second engine: a plan's emitted StableHLO, unchanged, as a jax callable.

``to_jax(plan)`` returns a :class:`JaxFunction`. Calling it runs the very
module ``plan.emit_stablehlo()`` prints, through jax's ``jax.export``
machinery, on whatever PJRT client jax has (XLA's CPU client, a GPU, a
TPU). The function takes the plan's arguments positionally (parameters,
then inputs, each in recording order, as ``CompiledPlan`` does) and
returns its results (roots, then observes) as a tuple of jax arrays, so
it composes with ``jax.jit``, ``jax.lax.fori_loop``, shardings
(``NamedSharding`` over a ``Mesh``) and anything else that traces a
function of arrays::

    from topos.interop.jax import to_jax

    step = to_jax(network.entry(updates.roots(loss)).lower())
    run = step.forward(parameters, {"x": batch})       # a JaxRun: run[loss], by Symbol
    train = jax.jit(step.training_step(updates))       # (parameters, inputs) -> (next, results)

How the module gets in: jax has no public "run this StableHLO" call, but
it does have ``jax.export.Exported``, the artifact that ``jax.export``
writes and ``Exported.call`` runs from inside any jax program. A trivial
function with the plan's argument and result types is exported, and the
copy keeps its types, tree and calling convention while its serialized
module is replaced by topos's (a StableHLO portable artifact, written by
jax's own ``jax.extend.mlir.serialize_portable_artifact``) and its
derivative by an error (gradients belong in the recording:
``tape.differentiate``). The ops are topos's, unchanged; on the way in
(1) the ``{topos.observe}`` result attributes are dropped (discardable
annotations that jax's writer refuses), (2) jax's writer legalizes CHLO
(``chlo.erf``) to StableHLO, as for every jax export, and (3) only when
jax's 64-bit mode is off, index arguments (selections, ``i64`` in the
module) enter as ``int32`` through a small wrapper ``@main`` that widens
them and calls topos's function, renamed ``@topos_main``.

Element types: float32 and bfloat16 run as they are. float64 needs
jax's 64-bit mode, switched on before any array is made::

    jax.config.update("jax_enable_x64", True)    # or JAX_ENABLE_X64=1 in the environment

and ``to_jax`` refuses a float64 plan without it (``JaxPrecisionError``).

Results are graded like IREE's: ``grade(entry, parameters, feeds)``
runs the entry with every computed node observed and judges each node
by ``topos.dialect.iree.conformance.check_values``, the envelopes IREE is held
to (``tests/test_interop_jax.py`` runs the conformance families and the
benchmark models this way). jax stays optional: this module imports it
only when called, and a missing jax is a ``JaxMissingError`` that says
``pip install jax``. Emitting StableHLO needs the MLIR extra
(``pip install topos[mlir]``), as ``plan.emit_stablehlo()`` does.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any

import numpy as np

from topos.base.copies import own
from topos.base.element import SelectionType, check_indices, is_element
from topos.base.errors import ArgumentError, DifferentiationError, FeedError, ShapeError, SymbolError, ToposError
from topos.base.provenance import Site, is_internal, user_site
from topos.readings.interpret import bind_feeds, bind_parameters, source_value
from topos.readings.plan.entry import an_entry
from topos.spec.network import source_name

# The conformance target XLA's results are graded under. XLA's CPU client, like IREE's CPU
# runtime, runs with subnormals flushed (measured: 1e-40 + 0 gives 0), and the conformance
# tables key that model (FLUSHES_SUBNORMALS) and the envelopes by target name: "llvm-cpu" is
# the entry with both, so XLA is held to exactly the envelopes IREE's llvm-cpu meets.
GRADED_AS = "llvm-cpu"

_INT32_MAX = 2**31 - 1


class JaxMissingError(ToposError, ImportError):
    """jax is not installed: topos.interop.jax runs plans through it."""


class JaxPrecisionError(ToposError):
    """A plan's element types need jax's 64-bit mode (float64, or 64-bit indices), which is off."""


class JaxModuleError(ToposError, RuntimeError):
    """jax or XLA refused the emitted module; the message carries what they said."""


class JaxDerivativeError(DifferentiationError):
    """jax was asked for the derivative of a plan (``jax.grad``, ``jax.vjp``): it belongs in the recording."""

    def __init__(self, message: str):
        # jax asks for the derivative from inside its own machinery (jax.grad's backward pass), so
        # the user's line is the innermost frame outside jax as well as outside topos.
        self.bare = message
        ToposError.__init__(self, f"{_site_outside_jax()}: {message}")


def _site_outside_jax() -> Site:
    """The innermost stack frame outside topos, jax and jaxlib: the line that called jax.grad."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and (is_internal(frame.f_code.co_filename)
                                 or str(frame.f_globals.get("__name__", "")).split(".")[0] in ("jax", "jaxlib")):
        frame = frame.f_back
    return user_site() if frame is None else Site(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


def _jax():
    """The jax module, or a JaxMissingError that says how to install it."""
    try:
        import jax
        import jax.export  # noqa: F401  (a submodule: not loaded by ``import jax`` on every version)
    except ImportError as error:
        raise JaxMissingError(
            f"topos.interop.jax runs plans through jax, which is not installed ({error}); "
            "install it with `pip install jax` (CPU), or `pip install \"jax[cuda12]\"` for NVIDIA GPUs"
        ) from None
    return jax


def x64_enabled() -> bool:
    """Whether jax's 64-bit mode is on (``jax.config.update("jax_enable_x64", True)``)."""
    return bool(_jax().config.jax_enable_x64)


# ---- the function --------------------------------------------------------------------------------


def to_jax(source, *, platform: str | None = None, debug_info: bool = True) -> JaxFunction:
    """The plan's emitted StableHLO as a jax callable (see :class:`JaxFunction`).

    ``source`` is a Plan, an Entry (lowered here) or a CompiledPlan (its
    plan). ``platform`` is the PJRT platform the function is exported for
    ("cpu", "cuda", "rocm", "tpu"); by default jax's default backend.
    With ``debug_info`` every op keeps its location (the node and the
    recording line), which XLA carries into its op metadata.
    """
    jax = _jax()
    plan = _plan_of(source)
    _check_platform(platform)
    x64 = x64_enabled()
    network = plan.network
    closure = sorted(plan.entry.closure())
    parameters = tuple(i for i in closure if network.columns.opcodes[i].name == "parameter")
    inputs = tuple(i for i in closure if network.columns.opcodes[i].name == "input")
    results = tuple(plan.entry._readable)
    _check_precision(network, parameters + inputs + results, x64)
    text = plan.emit_stablehlo(debug_info=debug_info)
    chosen = platform or jax.export.default_export_platform()
    exported = _exported(jax, network, parameters + inputs, results, text, x64, chosen)
    return JaxFunction(plan, parameters, inputs, results, text, exported, x64, chosen)


def _plan_of(source):
    from topos.readings.plan.entry import Entry
    from topos.readings.plan.plan import Plan

    if isinstance(source, Plan):
        return source
    if isinstance(source, Entry):
        return source.lower()
    plan = getattr(source, "plan", None)  # a CompiledPlan
    if isinstance(plan, Plan):
        return plan
    hint = "; lower an entry of it first: to_jax(network.entry([loss]).lower())" if hasattr(source, "entry") else ""
    raise ArgumentError(f"to_jax takes a Plan, an Entry or a CompiledPlan, got {type(source).__name__}{hint}")


# jax's built-in PJRT platforms, as jax.export names them. jax takes any string and fails only when
# the function runs, with a ValueError that does not say which argument was wrong.
_PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


def _check_platform(platform) -> None:
    if platform is None or platform in _PLATFORMS:
        return
    spelled = platform.lower() if isinstance(platform, str) else None
    fix = (f"write it in lower case: platform={spelled!r}" if spelled in _PLATFORMS else
           "name the GPU's runtime: platform='cuda' (NVIDIA) or 'rocm' (AMD)" if spelled == "gpu" else
           "name one of them, or leave platform out for jax's default backend")
    raise ArgumentError(f"to_jax(platform=...) takes one of {', '.join(map(repr, _PLATFORMS))}, got "
                        f"{type(platform).__name__} {platform!r}; {fix}")


def _wrong_platform(error: ValueError, platform: str) -> ArgumentError | None:
    """The refusal of a function exported for one platform and run on another, or None for other errors."""
    if "was exported for platforms" not in str(error):
        return None
    here = _jax().default_backend()
    return ArgumentError(f"this function was built with to_jax(platform={platform!r}), and jax runs it on {here!r}; "
                         f"call to_jax again with platform={here!r}, or leave platform out for jax's default backend")


def _check_precision(network, indices: Sequence[int], x64: bool) -> None:
    for i in indices:
        dtype = network.columns.specs[i].dtype
        if isinstance(dtype, SelectionType):
            if dtype.extent - 1 > _INT32_MAX and not x64:
                raise JaxPrecisionError(
                    f"{user_site()}: %{i} picks among {dtype.extent} rows, more than int32 can index, and "
                    "jax's 64-bit mode is off: call jax.config.update(\"jax_enable_x64\", True) before to_jax")
        elif np.dtype(dtype) == np.float64 and not x64:
            label = f"%{i}" + (f" ({network.columns.names[i]})" if i in network.columns.names else "")
            raise JaxPrecisionError(
                f"{user_site()}: this plan computes in float64 ({label} is f64), and jax holds float64 only "
                "in its 64-bit mode, which is off: call jax.config.update(\"jax_enable_x64\", True) before "
                "making any jax array (or set JAX_ENABLE_X64=1), or record the model in float32")


def _jax_dtype(dtype, x64: bool) -> np.dtype:
    if isinstance(dtype, SelectionType):
        return np.dtype(np.int64 if x64 else np.int32)
    return np.dtype(dtype)


def _exported(jax, network, arguments: Sequence[int], results: Sequence[int], text: str, x64: bool,
              platform: str):
    """A jax.export.Exported whose serialized module is ``text``; indices cross as int64 with x64, else int32."""
    import jax.numpy as jnp

    specs = network.columns.specs
    narrowed = not x64 and any(isinstance(specs[i].dtype, SelectionType) for i in (*arguments, *results))
    specs = [jax.ShapeDtypeStruct(network.columns.specs[i].shape, _jax_dtype(network.columns.specs[i].dtype, x64))
             for i in arguments]
    shapes = [(network.columns.specs[i].shape, _jax_dtype(network.columns.specs[i].dtype, x64)) for i in results]

    def placeholder(*_):  # only its types are kept
        return tuple(jnp.zeros(shape, dtype) for shape, dtype in shapes)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jnp.zeros(int64) without x64 warns; the wrapper narrows instead
        template = jax.export.export(jax.jit(placeholder), platforms=(platform,))(*specs)
    module = _portable_artifact(text, narrowed)
    try:
        return dataclasses.replace(
            template, fun_name="topos_plan", mlir_module_serialized=module,
            module_kept_var_idx=tuple(range(len(arguments))), _get_vjp=_no_derivative)
    except TypeError as error:  # a jax whose Exported has other fields
        raise JaxModuleError(
            f"this jax ({jax.__version__}) builds jax.export.Exported differently from the jax topos was "
            f"written against (0.10.2): {error}; install jax==0.10.2") from None


def _no_derivative(exported):
    raise JaxDerivativeError(
        "jax cannot differentiate a topos plan: its derivative is more graph. Record it "
        "with tape.differentiate(loss, parameters), put the gradients (or an optimizer's updates) in the "
        "entry, and call to_jax on that plan")


def _portable_artifact(text: str, narrowed: bool) -> bytes:
    """``text`` as a StableHLO portable artifact (versioned bytecode), written as ``jax.export`` writes one.

    jax's writer (``jax.extend.mlir.serialize_portable_artifact``) also
    legalizes CHLO (``chlo.erf``, which the lowering uses) to StableHLO,
    as every jax export does.
    """
    from jax.extend import mlir as extend
    from jax.extend.mlir import ir
    from jax.extend.mlir.dialects import stablehlo
    from jax.interpreters import mlir as jax_mlir

    with jax_mlir.make_ir_context() as context, ir.Location.unknown(context):
        try:
            module = ir.Module.parse(text)
        except Exception as error:  # jaxlib's MLIR is another build than IREE's: say what it refused
            raise JaxModuleError(f"jax's MLIR could not read the emitted StableHLO: {error}") from None
        _drop_topos_result_attributes(module)
        if narrowed:
            _narrow_indices(module)
        # What jax.export targets: a version at least 4 weeks old, so older consumers read it too.
        version = stablehlo.get_version_from_compatibility_requirement(
            stablehlo.StablehloCompatibilityRequirement.WEEK_4)
        try:
            return bytes(extend.serialize_portable_artifact(module, version))
        except Exception as error:
            raise JaxModuleError(f"jax could not serialize the emitted StableHLO: {error}") from None


def _drop_topos_result_attributes(module) -> None:
    """Remove topos's ``topos.*`` argument and result attributes (``{topos.observe}`` on observed results).

    They are discardable annotations that no compiler reads, and jaxlib's
    portable-artifact writer cannot express a unit attribute there: it
    refuses the whole ``func.func`` ("failed to legalize"). Nothing else
    in the module changes.
    """
    from jax.extend.mlir import ir

    for op in module.body.operations:
        for slot in ("arg_attrs", "res_attrs"):
            if slot not in op.attributes:
                continue
            kept = []
            for dictionary in ir.ArrayAttr(op.attributes[slot]):
                entries = ir.DictAttr(dictionary)
                kept.append({entries[k].name: entries[k].attr for k in range(len(entries))
                             if not entries[k].name.startswith("topos.")})
            if any(kept):
                op.attributes[slot] = ir.ArrayAttr.get([ir.DictAttr.get(entries) for entries in kept])
            else:
                del op.attributes[slot]


def _narrow_indices(module) -> None:
    """Rename ``@main`` to a private ``@topos_main`` and add a ``@main`` taking int32 where it takes i64.

    jax without 64-bit mode has no int64 arrays, so index arguments (and
    any index result) cross as int32; ``@topos_main`` runs unchanged.
    """
    from jax.extend.mlir import ir
    from jax.extend.mlir.dialects import func, stablehlo

    main = next(op for op in module.body.operations if ir.StringAttr(op.attributes["sym_name"]).value == "main")
    main.attributes["sym_name"] = ir.StringAttr.get("topos_main")
    main.attributes["sym_visibility"] = ir.StringAttr.get("private")
    signature = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
    i64, i32 = ir.IntegerType.get_signless(64), ir.IntegerType.get_signless(32)

    def narrow(t):
        ranked = ir.RankedTensorType(t)
        return ir.RankedTensorType.get(ranked.shape, i32) if ranked.element_type == i64 else t

    inputs, outputs = list(signature.inputs), list(signature.results)
    with ir.InsertionPoint(module.body):
        wrapper = func.FuncOp("main", ([narrow(t) for t in inputs], [narrow(t) for t in outputs]))
        block = wrapper.add_entry_block()  # type: ignore[attr-defined]
        with ir.InsertionPoint(block):
            arguments = [stablehlo.convert(wide, argument) if narrow(wide) != wide else argument
                         for wide, argument in zip(inputs, block.arguments)]
            call = func.CallOp(outputs, ir.FlatSymbolRefAttr.get("topos_main"), arguments)
            func.ReturnOp([stablehlo.convert(narrow(wide), value) if narrow(wide) != wide else value
                           for wide, value in zip(outputs, call.results)])


class JaxFunction:
    """A plan's emitted StableHLO as a jax function of arrays: ``fn(*arguments) -> tuple of results``.

    Arguments are ``parameters`` then ``inputs`` (Symbols, each in
    recording order); results are ``results`` (roots, then observes).
    Calling it inside ``jax.jit``, ``jax.lax.fori_loop`` or a sharded
    ``jit`` inlines the module into the traced program. ``forward`` and
    ``training_step`` are the topos-shaped doors: Parameters and feeds by
    Symbol or name in, results by Symbol out.
    """

    def __init__(self, plan, parameters: tuple[int, ...], inputs: tuple[int, ...], results: tuple[int, ...],
                 stablehlo: str, exported, x64: bool, platform: str):
        network = plan.network
        self.plan = plan
        self.network = network
        self.parameters = tuple(network.symbol(i) for i in parameters)
        self.inputs = tuple(network.symbol(i) for i in inputs)
        self.arguments = self.parameters + self.inputs
        self.results = tuple(network.symbol(i) for i in results)
        self.stablehlo = stablehlo
        self.exported = exported
        self.platform = platform
        self._x64 = x64
        self._position = {i: k for k, i in enumerate(results)}
        self._jitted: Callable | None = None

    # -- the jax side ------------------------------------------------------------------------
    def __call__(self, *arrays):
        """Run the module on ``arrays`` (parameters, then inputs) -> a tuple of jax arrays, one per result."""
        if len(arrays) != len(self.arguments):
            raise FeedError(f"{user_site()}: this plan takes {len(self.arguments)} arrays ({len(self.parameters)} "
                            f"parameters, then {len(self.inputs)} inputs), got {len(arrays)}")
        if x64_enabled() != self._x64:
            raise JaxPrecisionError(
                f"{user_site()}: jax's 64-bit mode was {'on' if self._x64 else 'off'} when to_jax built this "
                f"function and is {'off' if self._x64 else 'on'} now; call to_jax again")
        self._check_numpy_arguments(arrays)
        try:
            return tuple(self.exported.call(*arrays))
        except ValueError as error:  # jax's own shape and dtype checks: name the argument
            raise _wrong_platform(error, self.platform) or FeedError(
                f"{user_site()}: {self._named(str(error))}") from None

    def _check_numpy_arguments(self, arrays: Sequence) -> None:
        """Refuse what jax would change without a word in a NumPy argument.

        In jax's 32-bit mode a float64 array passed for a float32 argument
        is rounded (and a large value becomes inf), and an int64 index is
        wrapped to int32; XLA clamps an index outside the table to its last
        row. Only NumPy arguments are checked: a jax array (or a tracer,
        under jit) has jax's types already, and reading its values back from
        the device for a check would cost a transfer.
        """
        for k, (symbol, array) in enumerate(zip(self.arguments, arrays)):
            if not isinstance(array, (np.ndarray, np.generic)):
                continue
            dtype = self.network.columns.specs[symbol.index].dtype
            label = self.network.columns.names.get(symbol.index, f"%{symbol.index}")
            if isinstance(dtype, SelectionType):
                try:
                    check_indices(np.asarray(array), dtype.extent)
                except ShapeError as error:
                    raise FeedError(f"{user_site()}: argument {k} ({label}) is a selection: {error.bare}") from None
            elif array.dtype != dtype:
                raise FeedError(
                    f"{user_site()}: argument {k} ({label}) is {np.dtype(dtype).name}, got a {array.dtype} array "
                    f"(jax would convert it without a word); convert it with .astype(...) first")

    def _named(self, message: str) -> str:
        for k, symbol in reversed(list(enumerate(self.arguments))):
            label = self.network.columns.names.get(symbol.index, f"%{symbol.index}")
            message = message.replace(f"args[{k}]", f"argument {k} ({label})")
        return message

    def training_step(self, updates) -> Callable[[tuple, tuple], tuple[tuple, tuple]]:
        """A pure jax function ``(parameters, inputs) -> (next parameters, results)`` over tuples of arrays.

        ``parameters`` and ``inputs`` are ordered as ``self.parameters`` and
        ``self.inputs``; each parameter that ``updates`` updates is replaced
        by its update's result, the others pass through. jit it, loop it
        with ``jax.lax.fori_loop``, shard it.
        """
        positions = self._update_positions(updates)

        def step(parameters: tuple, inputs: tuple) -> tuple[tuple, tuple]:
            if not (isinstance(parameters, (tuple, list)) and isinstance(inputs, (tuple, list))):
                raise ArgumentError(  # a table or a feed dict would be iterated into Symbols and names
                    f"{user_site()}: the training step takes (parameters, inputs) as tuples of arrays, got "
                    f"{type(parameters).__name__} and {type(inputs).__name__}; make them with "
                    "function.parameter_arrays(table) and function.input_arrays(feeds)"
                )
            results = self(*parameters, *inputs)
            following = list(parameters)
            for slot, position in positions:
                following[slot] = results[position]
            return tuple(following), results

        return step

    def _update_positions(self, updates) -> tuple[tuple[int, int], ...]:
        from topos import Updates

        if not isinstance(updates, Updates):
            raise FeedError(f"{user_site()}: training_step takes the Updates that topos.sgd(...) or an "
                            f"optimizer's record(...) returned, got {type(updates).__name__}")
        slots = {s.index: k for k, s in enumerate(self.parameters)}
        updates.check_carries_state(self.network)
        pairs = []
        for parameter, new in updates.pairs():
            parameter, new = getattr(parameter, "symbol", parameter), getattr(new, "symbol", new)
            try:
                p, n = self.network.check(parameter, "updated parameter"), self.network.check(new, "update")
            except SymbolError as error:
                raise SymbolError(f"{user_site()}: these Updates belong to another network "
                                  f"({error.bare or error})") from None
            if n not in self._position:
                raise FeedError(f"{user_site()}: update {new!r} of {parameter!r} is not a result of this plan; "
                                "build it from network.entry(updates.roots(loss))")
            if p in slots:  # a parameter the plan does not read needs no carrying
                pairs.append((slots[p], self._position[n]))
        return tuple(pairs)

    # -- the topos side -------------------------------------------------------------------
    def parameter_arrays(self, parameters) -> tuple[np.ndarray, ...]:
        """The arrays of a Parameters table this function reads, in ``self.parameters`` order."""
        bound = bind_parameters(self.network, parameters, {s.index for s in self.parameters})
        return tuple(bound[s.index] for s in self.parameters)

    def input_arrays(self, feeds=None) -> tuple[np.ndarray, ...]:
        """Feeds (by Symbol or name; unfed inputs take their recorded value) in ``self.inputs`` order."""
        bound = bind_feeds(self.network, feeds, freeze=False)
        return tuple(self._as_argument(s.index, source_value(self.network, s.index, {}, bound))
                     for s in self.inputs)

    def _as_argument(self, i: int, value) -> np.ndarray:
        dtype = self.network.columns.specs[i].dtype
        if isinstance(dtype, SelectionType):
            return np.asarray(getattr(value, "indices", value), dtype=_jax_dtype(dtype, self._x64))
        return np.asarray(value)

    def as_parameters(self, arrays: Sequence, template):
        """A host Parameters table: ``template`` with this function's parameters set to ``arrays``."""
        if len(arrays) != len(self.parameters):
            raise FeedError(f"{user_site()}: {len(arrays)} arrays for {len(self.parameters)} parameters")
        return template.with_payloads({s: np.asarray(a) for s, a in zip(self.parameters, arrays)})

    def forward(self, parameters, feeds=None, *, shardings: Mapping | None = None) -> JaxRun:
        """Run once: Parameters and feeds in, a JaxRun readable by result Symbol.

        ``shardings`` maps argument Symbols (or names) to jax Shardings
        (``NamedSharding(mesh, PartitionSpec("batch"))``, say); those
        arguments are placed so and XLA partitions the run to match; the
        rest are left to ``jax.jit`` to place (replicated beside sharded
        ones).
        """
        jax = _jax()
        arguments = list(self.parameter_arrays(parameters) + self.input_arrays(feeds))
        if shardings is not None and not isinstance(shardings, Mapping):
            raise ArgumentError(f"{user_site()}: shardings maps argument Symbols or names to jax Shardings "
                                f"(a dict), got {type(shardings).__name__}")
        for symbol, sharding in (shardings or {}).items():
            if isinstance(symbol, str):
                symbol = self.network.named(symbol)
            i = self.network.check(symbol, "sharded argument")
            slot = next((k for k, s in enumerate(self.arguments) if s.index == i), None)
            if slot is None:
                raise SymbolError(f"{user_site()}: {symbol!r} is not an argument of this plan (a parameter or "
                                  "input it reads)")
            try:
                arguments[slot] = jax.device_put(arguments[slot], sharding)
            except (ValueError, TypeError) as error:  # not a Sharding, or one that does not fit the shape
                spec = self.network.node(symbol)
                raise FeedError(
                    f"{user_site()}: the sharding of {source_name(self.network.columns, i)} "
                    f"({list(spec.shape)} {spec.dtype}) does not "
                    f"fit it: {str(error).splitlines()[0]}; give a jax Sharding whose partitioned axes divide "
                    "the shape (NamedSharding(mesh, PartitionSpec('batch')) for rows)"
                ) from None
        if self._jitted is None:
            self._jitted = jax.jit(self.__call__)
        try:
            return JaxRun(self, self._jitted(*arguments))
        except jax.errors.JaxRuntimeError as error:  # XLA refused or failed to run the module
            raise JaxModuleError(f"{user_site()}: XLA could not compile or run this plan's module: {error}") from None
        except ValueError as error:  # the platform is checked when jit lowers the call, after __call__ traced
            wrong = _wrong_platform(error, self.platform)
            if wrong is None:
                raise
            raise wrong from None

    def __repr__(self) -> str:
        return (f"<JaxFunction on {self.platform}: {len(self.parameters)} parameters, {len(self.inputs)} inputs, "
                f"{len(self.results)} results>")


class JaxRun(Mapping):
    """Results of one call by result Symbol; ``run[symbol]`` is a read-only NumPy copy, the caller's own."""

    def __init__(self, function: JaxFunction, outputs: Sequence):
        self._function = function
        self._outputs = tuple(outputs)

    @property
    def network(self):
        """The network whose plan made this run."""
        return self._function.network

    def _index(self, symbol) -> int:
        i = self._function.network.check(symbol)
        if i not in self._function._position:
            raise SymbolError(f"{symbol!r} is not a declared result of this plan")
        return self._function._position[i]

    def __getitem__(self, symbol) -> np.ndarray:
        k = self._index(symbol)
        value = np.asarray(self._outputs[k])
        i = self._function.results[k].index
        if isinstance(self._function.network.columns.specs[i].dtype, SelectionType):
            value = value.astype(np.int64)
        return own(value)

    def device(self, symbol):
        """The result as the jax array the call returned (no host copy)."""
        return self._outputs[self._index(symbol)]

    def __iter__(self):
        return iter(self._function.results)

    def __len__(self) -> int:
        return len(self._outputs)


# ---- grading against the oracle --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class XlaDivergence:
    """A known way XLA leaves the envelopes IREE meets: which nodes, why, and where the fix belongs."""

    name: str
    reason: str
    fix: str
    dtypes: tuple[str, ...]
    keys: tuple[str, ...]
    cases: tuple[str, ...] = ()  # case names covered (empty: any)
    matches: Callable[[Any, int], bool] | None = None  # (network, node index) -> whether it is the pattern

    def covers(self, network, report) -> bool:
        if report.dtype not in self.dtypes or report.key not in self.keys:
            return False
        if self.cases and report.case not in self.cases:
            return False
        return self.matches is None or self.matches(network, report.index)


def _key_of(network, j: int) -> str:
    name = network.columns.opcodes[j].name
    return f"map:{dict(network.columns.attributes[j]).get('function')}" if name == "map" else name


def _rewritten_division(network, i: int) -> bool:
    """A division XLA's simplifier rewrites: by a sqrt or a quotient, or of a quotient."""
    dividend, divisor = (_key_of(network, j) for j in network.columns.operands[i])
    return divisor in ("map:sqrt", "div") or dividend == "div"


DIVERGENCES: tuple[XlaDivergence, ...] = (
    XlaDivergence(
        "xla-division-rewrites",
        "XLA's algebraic simplifier rewrites divisions: a / sqrt(b) into a * rsqrt(b), (a / b) / c into "
        "a / (b * c), a / (b / c) into (a * c) / b. Each is two roundings (and an approximate reciprocal "
        "square root) where IEEE division rounds once: measured 1 to 2 ulps (3 on an AVX-512 Xeon), in "
        "LayerNorm's normalisation and its gradient. No XLA flag turns these rewrites off.",
        "XLA; or dialect/passes/lowering.py: a stablehlo.optimization_barrier on the operand a division reads",
        ("f32", "f64", "bf16"), ("div",), matches=_rewritten_division),
    XlaDivergence(
        "xla-f64-log1p-kahan-folded",
        "The lowering computes float64 log1p as Kahan's log(u) * x / (u - 1), u = 1 + x, and XLA's algebraic "
        "simplifier folds (1 + x) - 1 into x, which leaves log(1 + x): up to 1e8 eps for small |x|. "
        "A stablehlo.optimization_barrier on u restores it (measured 0.89 eps).",
        "dialect/passes/lowering.py (_log1p: an optimization_barrier on u), or XLA",
        ("f64",), ("map:log1p",)),
    XlaDivergence(
        "xla-f64-tanh-near-one",
        "XLA's float64 tanh is 3.5 eps from the correctly rounded value for |x| in [15, 20], where tanh "
        "rounds to within a few ulps of 1; IREE's (libm's) meets the table's 3.",
        "XLA; or dialect/iree/conformance.py: an 'xla' entry in TARGET_TABLES with 5 for f64 tanh",
        ("f64",), ("map:tanh",), cases=("tanh/wide",)),
)


@dataclasses.dataclass(frozen=True)
class Grade:
    """Every computed node of an entry run on XLA, judged against its local reference (conformance)."""

    network: Any
    reports: tuple  # conformance.NodeReport per node, in recording order
    values: Mapping[int, np.ndarray]  # node index -> XLA's value
    oracle: Any  # the oracle's Run over the entry's closure

    @property
    def ok(self) -> bool:
        """Every node within its envelope."""
        return all(r.ok for r in self.reports)

    def failures(self) -> list:
        return [r for r in self.reports if not r.ok]

    def divergence_of(self, report) -> XlaDivergence | None:
        """The known XLA divergence that covers ``report``, if any."""
        return next((d for d in DIVERGENCES if d.covers(self.network, report)), None)

    def unexplained(self) -> list:
        """Failures that no known divergence (``DIVERGENCES``) covers: each one is news."""
        return [r for r in self.reports if not r.ok and self.divergence_of(r) is None]

    def worst(self, explained: bool = True) -> dict[str, float]:
        """TABLE key -> the worst deviation seen, in that envelope's unit (``explained=False``: outside
        the known divergences only)."""
        found: dict[str, float] = {}
        for r in self.reports:
            if explained or self.divergence_of(r) is None:
                found[r.key] = max(found.get(r.key, 0.0), r.deviation.worst)
        return found


def grade(entry, parameters, feeds=None, *, platform: str | None = None, shardings: Mapping | None = None,
          case_of: Mapping[int, str] | None = None) -> Grade:
    """Run ``entry`` on XLA with every computed node observed, and judge each node as IREE's are judged.

    Each node's value is compared with the reference kernel applied to
    XLA's values of its operands, within ``topos.dialect.iree.conformance``'s
    envelopes (``check_values``): error stays with the node that made it.
    Sources the entry declares as results must come back as fed.
    ``shardings`` (argument Symbol or name -> jax Sharding) grades the
    partitioned program instead, as ``JaxFunction.forward`` runs it.
    ``case_of`` (node index -> a label) names each report's case.
    """
    from topos.dialect.iree import conformance
    from topos.readings.plan.numerics import Numerics

    an_entry("grade", entry)
    if case_of is not None and not isinstance(case_of, Mapping):
        raise ArgumentError(f"grade(case_of=...) maps node indices to case labels (a dict such as {{3: 'tanh/wide'}}), "
                            f"got {type(case_of).__name__} {case_of!r}")
    network = entry.network
    closure = sorted(entry.closure())
    declared = {s.index for s in entry.results}
    checked = [i for i in closure if is_element(network.columns.specs[i].dtype)
               and (not network.columns.opcodes[i].is_source or i in declared)]
    observed = network.entry(list(entry.roots), observe=[network.symbol(i) for i in checked])
    run = to_jax(observed.lower(), platform=platform).forward(parameters, feeds, shardings=shardings)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the oracle's NaNs are data
        oracle = network.entry(list(entry.roots), observe=[network.symbol(i) for i in closure],
                               numerics=Numerics.EXACT).interpret(parameters, feeds)
    values = {i: run[network.symbol(i)] for i in checked}
    sources = {i: oracle[network.symbol(i)] for i in closure if network.columns.opcodes[i].is_source}
    reports = conformance.check_values(network, values, sources, GRADED_AS, case_of)
    if shardings:
        reports = [_partitioned_scatter(network, r, values, sources) if r.key == "scatter" else r for r in reports]
    return Grade(network, tuple(reports), values, oracle)


def _partitioned_scatter(network, report, values, sources):
    """A scatter's report under a sharding: graded as the accumulation it becomes.

    On one device the lowering adds colliding rows in the reference's
    order, bit for bit. When the rows are split over devices, XLA
    scatters each device's rows into its own table and adds the tables
    with an all-reduce: another order. The scatter then is the sum
    ``onehot(selection)^T @ rows`` and is held to that matmul's envelope
    (the conformance TABLE's, in the same unit).
    """
    from topos.dialect.iree import conformance
    from topos.spec.opcodes import by_name

    i = report.index
    rows_node, selection_node = network.columns.operands[i]
    extent = dict(network.columns.attributes[i])["extent"]
    operands = [values[j] if j in values else sources[j] for j in (rows_node, selection_node)]
    operands = [conformance.flush_subnormals(v) for v in operands]
    rows, selection = np.asarray(operands[0]), np.asarray(operands[1])
    with np.errstate(all="ignore"):
        want = conformance.flush_subnormals(by_name("scatter").kernel(rows, selection, extent=extent))
    got = conformance.flush_subnormals(values[i])
    flat = rows.reshape((selection.size, -1))
    onehot = np.eye(extent, dtype=rows.dtype)[selection.reshape(-1)].T  # [extent, rows]
    chosen = conformance.envelope("matmul", None, rows.dtype)
    verdict = conformance.compare(got.reshape(extent, -1), want.reshape(extent, -1), chosen, "matmul", {},
                                  [onehot, flat])
    return dataclasses.replace(report, deviation=verdict)


__all__ = [
    "DIVERGENCES", "GRADED_AS", "Grade", "JaxDerivativeError", "JaxFunction", "JaxMissingError", "JaxModuleError",
    "JaxPrecisionError",
    "JaxRun", "XlaDivergence", "grade", "to_jax", "x64_enabled",
]
