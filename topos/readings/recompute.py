"""A backward scan that keeps only segment boundaries and recomputes the rest: gradients in less memory.

``network.forward`` followed by ``run.backward`` holds every forward value
of the run and every cotangent of the scan until the scan returns: for a
deep chain, two arrays per node. This is another reading of the same spec
and the same derivative rules, known elsewhere as gradient checkpointing or
rematerialization (a topos *checkpoint* is a parameters file,
``topos.checkpoint``, so this module says *boundaries*):

1. The target's ancestors are cut, in recording order, into segments of
   ``segment`` computed nodes. A *boundary* is a value that a later segment
   reads.
2. A forward sweep evaluates the ancestors and keeps only the boundaries
   (and the target); every other value is dropped after its last reader.
3. The backward scan visits the segments from the last to the first. It
   recomputes a segment from the boundaries before it, runs the rules of
   the segment's nodes in reverse recording order, then drops the segment.
   A cotangent is dropped once its node's rule has run.
4. A rule is handed only the forward values its opcode's ``reads()``
   declares; in every other position it gets a stand-in that knows its
   shape and element type and refuses arithmetic. Recomputed values no rule
   reads are dropped at once, and a ``reads()`` that leaves out something
   its rule uses fails here, by name.

The rules run in the same order, on the same bits, with the same
accumulation order as in ``run.backward`` (the contract in
``topos/readings/differentiate.py``), and the reference kernels are deterministic,
so the gradients are bit-identical. The price is a second forward
evaluation of every segment; with the default segment of about sqrt(n)
nodes a chain of n nodes holds O(sqrt(n)) values at once.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from topos.base.copies import own
from topos.base.errors import ArgumentError
from topos.readings.differentiate import Unread, scalar_target, varying
from topos.readings.eager import Eager
from topos.readings.interpret import bind_feeds, bind_parameters, source_value
from topos.spec.opcodes import OUTPUT
from topos.spec.parameters import Parameters


def backward(network, parameters, feeds, target, *, segment: int | None = None) -> tuple[np.ndarray, Parameters]:
    """The target's value and its gradients (a Parameters table), holding only segment boundaries.

    The same values as ``run.backward(target).parameters(parameters)`` after
    ``run = network.forward(parameters, feeds)``, bit for bit. ``segment``
    is how many computed nodes each recomputed segment holds (default:
    about the square root of the target's computed ancestors).
    """
    t = scalar_target(network, target)
    spec = network.columns.specs[t]
    bound_parameters = bind_parameters(network, parameters)
    bound_feeds = bind_feeds(network, feeds)
    ancestors = sorted(network.entry([target]).closure())
    opcodes = network.columns.opcodes
    values = {  # sources are the caller's arrays: always at hand, never dropped
        i: source_value(network, i, bound_parameters, bound_feeds) for i in ancestors if opcodes[i].is_source
    }
    steps = [i for i in ancestors if not opcodes[i].is_source]
    segments = _segments(steps, segment)
    boundaries = _boundaries(network, segments)
    flows = varying(network.columns)
    read = rule_reads(network, steps, flows)

    _sweep(network, steps, values, hold=boundaries | {t})
    value = values[t]
    cotangents: dict[int, Any] = {t: Eager(_ones(spec))}
    for nodes in reversed(segments):
        _sweep(network, nodes, values, hold=boundaries | read)
        for i in reversed(nodes):
            g = cotangents.pop(i, None)
            if g is not None and flows[i]:
                _apply_rule(network, i, g, values, cotangents, flows)
        for i in nodes:
            values.pop(i, None)
    gradients = []
    for symbol in parameters.symbols():
        c = cotangents.get(symbol.index)
        slot = network.columns.specs[symbol.index]
        gradients.append((symbol, np.zeros(slot.shape, slot.dtype) if c is None else c.array))
    return own(value), parameters._like(gradients)


def _apply_rule(network, i: int, g, values, cotangents, flows) -> None:
    """Run node i's rule on the values it reads and add each contribution as it arrives."""
    opcode, operands = network.columns.opcodes[i], network.columns.operands[i]
    attributes = dict(network.columns.attributes[i])
    declared = opcode.reads(**attributes)

    def argument(position, j):
        if position in declared or network.columns.opcodes[j].is_source:
            return Eager(values[j], network.columns.specs[j].dtype)
        return Unread(opcode, position, network.columns.specs[j])

    arguments = [argument(k, j) for k, j in enumerate(operands)]
    contributions = opcode.rule(*arguments, argument(OUTPUT, i), g, **attributes)
    for j, c in zip(operands, contributions):
        if c is None or not flows[j]:
            continue
        if network.columns.opcodes[j].is_source and network.columns.opcodes[j].name != "parameter":
            continue  # an input's gradient is not asked for: do not hold it
        previous = cotangents.get(j)
        cotangents[j] = c if previous is None else previous + c


def _sweep(network, nodes, values, hold) -> None:
    """Evaluate ``nodes`` (ascending) into ``values``; drop each after its last reader there unless held.

    A node already in ``values`` (a boundary kept by the forward sweep) is
    not computed again.
    """
    opcodes, operands, attributes = network.columns.opcodes, network.columns.operands, network.columns.attributes
    last = {}
    for i in nodes:
        for j in operands[i]:
            last[j] = i
    with np.errstate(all="ignore"):  # IEEE inf/nan results are semantics, as in the oracle
        for i in nodes:
            if i not in values:
                out = np.asarray(opcodes[i].kernel(*(values[j] for j in operands[i]), **dict(attributes[i])))
                out.flags.writeable = False
                values[i] = out
            for j in {i, *operands[i]}:
                if last.get(j, i) == i and j not in hold and not opcodes[j].is_source:
                    values.pop(j, None)


def _segments(steps: list[int], segment: int | None) -> list[list[int]]:
    if segment is None:
        segment = max(1, math.isqrt(len(steps)))
    if not isinstance(segment, int) or isinstance(segment, bool) or segment < 1:
        raise ArgumentError(f"segment must be a positive number of nodes (an int), got {segment!r}; "
                            "leave it out for about the square root of the node count")
    return [steps[k : k + segment] for k in range(0, len(steps), segment)]


def _boundaries(network, segments) -> set[int]:
    """The computed values some later segment reads."""
    home = {i: s for s, nodes in enumerate(segments) for i in nodes}
    return {
        j
        for s, nodes in enumerate(segments)
        for i in nodes
        for j in network.columns.operands[i]
        if home.get(j, s) < s
    }


def rule_reads(network, nodes, flows=None) -> set[int]:
    """The computed values the derivative rules of ``nodes`` (those on a gradient's path) declare they read.

    What a backward-posture plan keeps (``Entry.kept``), and what this
    module's backward holds while a segment's rules run.
    """
    flows = varying(network.columns) if flows is None else flows
    read = set()
    for i in nodes:
        if not network.columns.opcodes[i].is_source and flows[i]:
            for position in network.columns.opcodes[i].reads(**dict(network.columns.attributes[i])):
                read.add(i if position == OUTPUT else network.columns.operands[i][position])
    return read


def _ones(spec) -> np.ndarray:
    array = np.ones(spec.shape, dtype=spec.dtype)
    array.flags.writeable = False
    return array


__all__ = ["backward", "rule_reads"]
