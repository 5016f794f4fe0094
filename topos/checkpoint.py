"""Checkpoints: parameters and optimizer state as safetensors files, one tensor per slot name.

``save(path, parameters, state)`` writes every slot under its name
(``fc1.weight``, ``optim.exp_avg.fc1.weight``) atomically: a crash leaves
the previous file or the new one, never a torn one. ``load(path, network)``
fills the network's parameter table by name and refuses, naming each, the
slots the file lacks, the tensors nobody claims and the shapes or element
types that differ, all from the file's header before any tensor is read;
then it reads only the tensors it keeps. Because module names are
PyTorch's, a ``torch.nn`` state_dict saved with
``safetensors.torch.save_file`` loads as is, and ``save`` takes a
state_dict of torch tensors (bfloat16 and requires-grad ones included).
Nothing here pickles; the format is in ``topos/base/safetensors_io.py``.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping, Sequence

import numpy as np

from topos import ArgumentError, CheckpointError, Network, Parameters
from topos.base.element import host_array
from topos.base.safetensors_io import header, read, read_metadata, write
from topos.spec.parameters import check_keyed_by_name


def _named(path, table) -> dict[str, np.ndarray]:
    if isinstance(table, Network):  # it has .named too, but names nodes, not slots with values
        raise CheckpointError("save takes the network's Parameters, not the Network: save(path, network.parameters())")
    if isinstance(table, Parameters):
        return table.named()
    if hasattr(table, "to_host"):  # device-resident parameters of a compiled plan
        return table.to_host().named()
    if hasattr(table, "named"):  # an optimizer's host state
        return table.named()
    if isinstance(table, Mapping):
        return _host_arrays(path, table)
    raise CheckpointError(
        f"save takes Parameters, optimizer state or a mapping of name -> array, got {type(table).__name__}"
    )


def _host_arrays(path, mapping: Mapping) -> dict[str, np.ndarray]:
    """A mapping of name -> array-like (a torch state_dict, jax arrays) as NumPy arrays, checked by name."""
    try:
        check_keyed_by_name(mapping, "save(path, mapping)")
    except ArgumentError as error:
        raise CheckpointError(f"{os.fspath(path)}: {error.bare}") from None
    arrays = {}
    for name, value in mapping.items():
        try:  # host_array reads bfloat16 and requires-grad torch tensors, which numpy.asarray refuses
            arrays[name] = np.asarray(host_array(value))
        except (TypeError, ValueError, RuntimeError, BufferError, NotImplementedError) as error:
            raise CheckpointError(
                f"{os.fspath(path)}: tensor {name!r} is a {type(value).__name__} that does not convert to a NumPy "
                f"array ({error}); pass NumPy arrays, or tensors with data on the CPU (tensor.cpu())"
            ) from None
    return arrays


def save(path, *tables, metadata: Mapping[str, str] | None = None) -> None:
    """Write every slot of ``tables`` (Parameters, optimizer state, resident parameters, mappings) to ``path``."""
    if not tables:
        raise CheckpointError(f"{os.fspath(path)}: save needs at least one table to write")
    merged: dict[str, np.ndarray] = {}
    for table in tables:
        for name, array in _named(path, table).items():
            if name in merged:
                raise CheckpointError(
                    f"{os.fspath(path)}: two tables both hold {name!r}; give the optimizer another prefix "
                    "or save the tables to separate files"
                )
            merged[name] = array
    write(path, merged, metadata)


def load(path, network, *, optimizer=None, strict: bool = True, ignore: Sequence[str] = ()):
    """The network's parameter table filled by name from ``path`` (with ``optimizer``: also its host state).

    Every slot must be in the file and every tensor in the file must be
    claimed by a slot (or, with ``optimizer``, by its state), unless
    ``strict=False``: then missing slots keep their initials and unclaimed
    tensors are skipped. ``ignore`` lists names or shell patterns to skip,
    for example ``("*.num_batches_tracked",)`` for a PyTorch BatchNorm.
    Shapes and element types must always match. Returns a Parameters
    table, or ``(parameters, optimizer_state)`` when ``optimizer`` is given.
    """
    if isinstance(path, (Network, Parameters)):
        raise CheckpointError("load takes the path first, then the network: load(path, network)")
    if isinstance(network, Parameters):
        raise CheckpointError("load takes the Network, not its Parameters, and returns the filled table: "
                              "parameters = load(path, network)")
    if not isinstance(network, Network):
        raise CheckpointError(f"load takes a Network second (from Tape.record), got {type(network).__name__}")
    if isinstance(ignore, str) or not isinstance(ignore, Sequence) or not all(isinstance(p, str) for p in ignore):
        raise CheckpointError(f"ignore={ignore!r}: pass a list of names or shell patterns, such as "
                              "ignore=['*.num_batches_tracked']")
    if optimizer is not None and (isinstance(optimizer, type) or not all(
            callable(getattr(optimizer, method, None)) for method in ("layout", "init", "state_from"))):
        made = f"the class {optimizer.__name__}" if isinstance(optimizer, type) else f"a {type(optimizer).__name__}"
        raise CheckpointError(f"optimizer= takes an optimizer instance, such as optim.Adam(lr=1e-3), got {made}; "
                              "pass the optimizer the state was saved with")
    # The header first: a file that does not fit is refused before any tensor is read into memory.
    stored = {n: (tuple(h.shape), h.dtype) for n, h in header(path).items()
              if not any(fnmatch.fnmatchcase(n, p) for p in ignore)}
    table = network.parameters()
    wanted = {name: (array.shape, array.dtype) for name, array in table.named().items()}
    if optimizer is not None:
        wanted.update(optimizer.layout(table))
    missing = [n for n in wanted if n not in stored]
    unexpected = [n for n in stored if n not in wanted]
    mismatched = [
        f"{n}: the file holds {list(stored[n][0])} {stored[n][1]}, the network needs "
        f"{list(shape)} {np.dtype(dtype)}"
        for n, (shape, dtype) in wanted.items()
        if n in stored and stored[n] != (tuple(shape), np.dtype(dtype))
    ]
    problems = list(mismatched)
    if strict and missing:
        problems.insert(0, "missing from the file: " + ", ".join(missing))
    if strict and unexpected:
        hint = "; pass ignore=('*.num_batches_tracked',) for PyTorch BatchNorm counters" if any(
            n.endswith("num_batches_tracked") for n in unexpected) else ""
        problems.append("in the file but not in the network: " + ", ".join(unexpected) + hint)
    if problems:
        fix = ("record the model with the same modules and sizes, or pass strict=False / ignore=[...] to load "
               "what matches") if strict else ("shapes and element types must match even with strict=False: "
                                               "record the model with the same sizes, or skip those tensors "
                                               "with ignore=[...]")
        raise CheckpointError(f"{os.fspath(path)} does not fit this network:\n  " + "\n  ".join(problems)
                              + "\n  " + fix)
    tensors = read(path, [n for n in wanted if n in stored])
    if {n: (a.shape, a.dtype) for n, a in tensors.items()} != {n: stored[n] for n in tensors}:
        raise CheckpointError(f"{os.fspath(path)} changed while it was loaded; load it once its writer is done")
    parameters = network.parameters({n: a for n, a in tensors.items() if n in table.names()}, strict=False)
    if optimizer is None:
        return parameters
    if missing:
        state = optimizer.init(parameters).named()
        state.update({n: tensors[n] for n in state if n in tensors})
    else:
        state = tensors
    return parameters, optimizer.state_from(state, parameters)


__all__ = ["header", "load", "read", "read_metadata", "save", "write"]
