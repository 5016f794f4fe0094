"""The oracle: walk the spec in recording order with the reference kernels.

Its bits are the truth every faster path is graded against.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import numpy as np

from topos.base.element import (
    Selection,
    SelectionType,
    check_indices,
    convert_checked,
    host_array,
    integer_indices,
    short_name,
)
from topos.base.errors import FeedError, SymbolError
from topos.spec.parameters import Parameters
from topos.spec.run import Run


def bind_parameters(network, parameters, wanted=None) -> dict[int, np.ndarray]:
    """Check a Parameters table against the network and return arrays by node index."""
    if not isinstance(parameters, Parameters):
        raise FeedError(f"expected a Parameters table (network.parameters()), got {type(parameters).__name__}")
    if parameters._family is not network.family:
        raise SymbolError(
            "these Parameters belong to another network family (recording the same model twice makes two "
            "networks, each with its own table); pass the parameters of the network this came from "
            "(network.parameters()), or move the weights over by name with network.parameters(other_parameters)"
        )
    bound = {}
    for i in network.columns.slots:
        if wanted is not None and i not in wanted:
            continue
        position = parameters._position.get(i)
        label = f"%{i}" + (f" ({network.columns.names[i]})" if i in network.columns.names else "")
        if position is None:
            raise FeedError(
                f"parameter {label} has no slot in this table; after reopen(), use "
                "parameters.carried(network) to add the new slots"
            )
        array = parameters._arrays[position]
        spec = network.columns.specs[i]
        if array.shape != spec.shape or array.dtype != spec.dtype:
            raise FeedError(
                f"parameter {label} holds {list(array.shape)} {array.dtype}, "
                f"the spec records {list(spec.shape)} {short_name(spec.dtype)}"
            )
        bound[i] = array
    return bound


def bind_feeds(network, feeds, freeze: bool = True) -> dict[int, np.ndarray]:
    """Check feeds ({input symbol or name: array-like}) and return read-only arrays by node index.

    With ``freeze`` each feed is copied, so a caller mutating its array
    later cannot change a run; a consumer that copies the data at once (a
    compiled plan uploading to its device) passes False and skips the copy.
    """
    if feeds is None:
        return {}
    if type(feeds) is not dict and not isinstance(feeds, Mapping):
        raise FeedError(_not_a_mapping(network, feeds))
    bound: dict[int, np.ndarray] = {}
    columns = network.columns
    given: dict[int, object] = {}  # how each input was keyed, to name both keys of one fed twice
    for key, value in feeds.items():
        symbol = network.named(key) if isinstance(key, str) else key
        i = network.check(symbol, "fed symbol")
        if columns.opcodes[i].name != "input":
            raise FeedError(
                f"%{i} is a {columns.opcodes[i].name}, not an input; only inputs can be fed "
                f"(recorded at {columns.sites[i]})"
            )
        if i in given:
            raise FeedError(
                f"{_Where(i, columns.names.get(i), columns.sites[i])} is fed twice, "
                f"{_keyed(given[i])} and {_keyed(key)}; feed it once"
            )
        given[i] = key
        spec = columns.specs[i]
        bound[i] = _coerce_feed(i, value, spec, columns.sites[i], freeze, columns.names.get(i))
    return bound


def _not_a_mapping(network, feeds) -> str:
    """What a run was fed instead of a dict, and a dict it could have been fed, with a real input's name."""
    names = [network.columns.names[i] for i in network.columns.inputs if i in network.columns.names]
    example = f"{{x: batch}} (x an input's Symbol) or {{{names[0]!r}: batch}}" if names else "{x: batch}"
    hint = "; dict(pairs) makes one from (key, array) pairs" if isinstance(feeds, (list, tuple)) else ""
    return (f"feeds must be a dict of {{input Symbol or name: array}}, got {type(feeds).__name__}; "
            f"e.g. {example}{hint}")


def _keyed(key) -> str:
    return f"by its name {key!r}" if isinstance(key, str) else "by its Symbol"


class _Where:
    """``input %i (name) (recorded at site)``, spelled out only when a message needs it (every step binds feeds)."""

    __slots__ = ("i", "name", "site")

    def __init__(self, i, name, site):
        self.i, self.name, self.site = i, name, site

    def __str__(self) -> str:
        return f"input %{self.i}{f' ({self.name})' if self.name else ''} (recorded at {self.site})"


def _coerce_feed(i, value, spec, site, freeze: bool = True, name: str | None = None) -> np.ndarray:
    where = _Where(i, name, site)
    fed = value
    if type(value) is not np.ndarray:
        _refuse_masked(where, value)
    value = _host_value(where, value, spec)
    if isinstance(spec.dtype, SelectionType):
        if isinstance(value, Selection):
            if value.extent <= spec.dtype.extent and value.indices.shape == spec.shape:
                return value.indices  # checked when it was made, read-only and its own: no copy, no recheck
            value = value.indices
        array = _as_array(where, value, spec)
        try:
            array = integer_indices(array)
            check_indices(array, spec.dtype.extent)
        except ValueError as error:
            raise FeedError(f"{where} is a selection: {getattr(error, 'bare', '') or error}") from None
    elif isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        if array.dtype != spec.dtype:
            raise FeedError(
                f"{where} expects element type {short_name(spec.dtype)}, got {array.dtype}; "
                f"convert with {conversion(fed, spec)} first"
            )
    else:
        array = _as_array(where, value, spec, spec.dtype)
    if array.shape != spec.shape:
        raise FeedError(f"{where} expects shape {list(spec.shape)}, got {list(array.shape)}")
    if not freeze:
        return array
    array = np.array(array)
    array.flags.writeable = False
    return array


def _refuse_masked(where, value) -> None:
    """A masked array's mask would be dropped without a word by np.asarray: refuse it."""
    ma = sys.modules.get("numpy.ma")  # a masked array exists only once numpy.ma is imported
    if ma is not None and isinstance(value, ma.MaskedArray):
        raise FeedError(
            f"{where} was fed a masked array: masked arrays are not supported (the mask would be "
            "ignored); pass .filled(value) with the value the masked elements should take"
        )


def _host_value(where, value, spec):
    """A torch tensor, jax array or DLPack exporter as NumPy (``element.host_array``); anything else as it is."""
    try:
        return host_array(value)
    except (TypeError, ValueError, RuntimeError, BufferError) as error:  # a dtype NumPy lacks, a tracer, ...
        raise FeedError(
            f"{where} expects {list(spec.shape)} {short_name(spec.dtype)}; "
            f"the fed {type(value).__name__} does not convert to a NumPy array: {error}"
        ) from None


def conversion(fed, spec) -> str:
    """How the caller converts what they fed: ``.to(torch.float32)`` for a torch tensor, ``float(x)`` for a
    NumPy number fed to a rank-0 input (a schedule's np.float64 rate), ``.astype(...)`` else."""
    if type(fed).__module__.split(".")[0] == "torch":
        return f".to(torch.{np.dtype(spec.dtype).name})"
    if isinstance(fed, np.generic) and spec.shape == () and np.dtype(spec.dtype).kind in "fc":
        return "float(x) (a Python number takes the input's element type) or .astype(...)"
    return ".astype(...)"


def _as_array(where, value, spec, dtype=None) -> np.ndarray:
    # A ragged list or a string fails inside NumPy; say which input and what it expects.
    try:
        array = np.asarray(value)
        if dtype is None:
            return array
        if array.dtype.kind not in "fiub" and array.dtype != dtype:
            raise TypeError(f"elements of type {array.dtype} are not numbers")
    except (TypeError, ValueError) as error:
        raise FeedError(
            f"{where} expects {list(spec.shape)} {short_name(spec.dtype)}; "
            f"the fed {type(value).__name__} does not convert: {error}"
        ) from None
    if array.dtype.kind == "b":  # True is not 1.0 here, as a bool array is not (its type must match)
        raise FeedError(
            f"{where} expects {list(spec.shape)} {short_name(spec.dtype)}, got booleans "
            f"({type(value).__name__}); feed numbers: float(flag) for one, "
            f"np.asarray(mask, np.{np.dtype(dtype).name}) for many"
        )
    converted, overflow = convert_checked(array, dtype)  # a NumPy array of another type was refused above
    if overflow is not None:
        raise FeedError(
            f"{where} is {overflow.element}, which cannot hold the fed {type(value).__name__} {overflow}; "
            "scale the value into range, or record the input with a wider element type"
        )
    return converted


def source_value(network, i, parameters, feeds):
    columns = network.columns
    name = columns.opcodes[i].name
    if name == "parameter":
        return parameters[i]
    if name == "input":
        if i in feeds:
            return feeds[i]
        if i in columns.required:
            raise FeedError(
                f"input {columns.names.get(i, f'%{i}')} (%{i}, recorded at {columns.sites[i]}) is "
                f"required and was not fed; feed it {list(columns.specs[i].shape)} "
                f"{short_name(columns.specs[i].dtype)} in the run's feeds"
            )
        return columns.payloads[i]
    return columns.payloads[i]


def evaluate(network, order, parameters, feeds) -> dict[int, np.ndarray]:
    """Evaluate the nodes in ``order`` (ascending indices) with the reference kernels."""
    values: dict[int, np.ndarray] = {}
    with np.errstate(all="ignore"):  # IEEE results (inf, nan) are the semantics, not accidents
        evaluate_into(values, network, order, parameters, feeds)
    return values


def evaluate_into(values, network, order, parameters, feeds) -> None:
    """Evaluate the nodes ``order`` names, in that order, into ``values`` (node -> array) with the reference kernels."""
    opcodes, operands, attributes = network.columns.opcodes, network.columns.operands, network.columns.attributes
    for i in order:
        opcode = opcodes[i]
        if opcode.is_source:
            values[i] = source_value(network, i, parameters, feeds)
            continue
        out = np.asarray(opcode.kernel(*(values[j] for j in operands[i]), **dict(attributes[i])))
        out.flags.writeable = False
        values[i] = out


def interpret(network, parameters, feeds, wanted=None) -> Run:
    """Run the spec (or the ancestor closure ``wanted``) and return a Run."""
    bound_parameters = bind_parameters(network, parameters, wanted)
    bound_feeds = bind_feeds(network, feeds)
    order = range(len(network)) if wanted is None else sorted(wanted)
    values = evaluate(network, order, bound_parameters, bound_feeds)
    return Run(network, values, readable=None if wanted is None else frozenset(wanted))
