"""Communication accounting: the bytes an ES generation or a GRPO step moves between devices.

Two independent counts that the tests hold against each other:

1. **From the compiled program** (`hlo_collectives`, `count_collectives`): parse the optimised HLO
   text of ``jax.jit(f).lower(...).compile().as_text()`` for ``all-gather``, ``all-reduce``,
   ``reduce-scatter``, ``all-to-all`` and ``collective-permute`` (and their async ``-done`` halves),
   read each op's result shape / dtype, its replica group size n and its first group's devices
   (`Collective.first_group`; the mesh axes it spans: `mesh_axes`).
2. **By construction** (`essa_generation_bytes`, `grpo_step_bytes`): ESSA gathers P fitness floats
   per generation and nothing else (arXiv 2507.04453, Sec. 3: every worker regenerates the
   population from the shared seed); data-parallel GRPO all-reduces the trainable gradient once per
   optimizer update, and a separate rollout engine also receives the updated trainable weights.

Two sizes are reported per collective:

- ``payload_bytes``: the logical size of the collective's full (gathered / reduced) value: P x 4
  bytes for the fitness gather, the gradient's bytes for an all-reduce. Independent of n.
- ``wire_bytes_per_device``: bytes each device sends with the bandwidth-optimal ring algorithms
  (Patarasuk & Yuan 2009; what NCCL's "bus bandwidth" assumes): all-gather and reduce-scatter
  (n-1)/n x S, all-reduce 2 (n-1)/n x S (a reduce-scatter then an all-gather), all-to-all
  (n-1)/n x S, collective-permute S per sending device, with S the full value's bytes.

Loops: an op inside a ``while`` body (a scan over layers: the per-layer gradient all-reduce of a
LoRA) runs once per iteration; `Collective.count` is the product of the ``known_trip_count`` of
every enclosing loop (XLA records it in the while op's backend_config), and totals multiply by it.
A loop without a known trip count counts once and sets ``trip_count_known=False``. Conditionals
count every branch (an upper bound). The CPU backend upcasts bf16 all-reduces to f32 (so on CPU
the HLO shows twice the bytes of a bf16 gradient; accelerators keep bf16).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

# Bytes of a pytree's array leaves: the one count, in essa_jax.memory (re-exported here).
from essa_jax.memory import tree_bytes  # noqa: F401

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")

_DTYPE_BYTES = {
    "pred": 1,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}

# `%name = <shape> <opcode>(` where <shape> is `f32[8,3]{1,0}` or a tuple `(f32[2]{0}, ...)`;
# the shape is matched lazily up to the first ` <collective opcode>(` (operands are `%names`).
_INSTR = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.+?)\s+"
    r"(?P<op>all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)"
    r"(?P<suffix>-start|-done)?\("
)
_ARRAY = re.compile(r"(?P<dtype>[a-z]+\d*(?:e\d+m\d+(?:fn)?)?)\[(?P<dims>[\d,]*)\]")
_GROUPS_LIST = re.compile(r"replica_groups=\{(?P<body>(?:\{[\d,\s]*\},?\s*)*)\}")
_GROUPS_IOTA = re.compile(
    r"replica_groups=\[(?P<g>\d+),(?P<s>\d+)\]<=\[(?P<dims>[\d,]+)\](?:T\((?P<perm>[\d,]+)\))?"
)
_PAIRS = re.compile(r"source_target_pairs=\{(?P<body>(?:\{\d+,\d+\},?\s*)*)\}")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective op of a compiled program (sizes per occurrence)."""

    kind: str  # one of KINDS
    name: str  # HLO instruction name
    dtype: str  # element type of the (first) result array
    shapes: tuple[tuple[int, ...], ...]  # result arrays (a tuple result has several)
    group_size: int  # devices per replica group (n)
    num_pairs: int  # collective-permute: source->target pairs; 0 otherwise
    payload_bytes: float  # full gathered / reduced value (see module docstring), per execution
    wire_bytes_per_device: (
        float  # ring-algorithm bytes sent per participating device, per execution
    )
    computation: str = ""  # HLO computation holding the op
    count: int = 1  # executions per program run (product of enclosing loops' trip counts)
    trip_count_known: bool = True
    # Device ids of the first replica group (positions in the program's device assignment, i.e.
    # in its mesh's flattened device array); () when the op names none (= every device). Which
    # mesh axes the op spans (`mesh_axes`) follows from it: group sizes alone confuse two axes
    # of one size (data 4 x model 4).
    first_group: tuple[int, ...] = ()


def _array_bytes(dtype: str, dims: Sequence[int]) -> float:
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"unknown HLO element type {dtype!r}; known: {sorted(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[dtype] * math.prod(dims)


def _parse_arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for m in _ARRAY.finditer(shape):
        dims = tuple(int(d) for d in m.group("dims").split(",") if d)
        out.append((m.group("dtype"), dims))
    return out


def _group_size(group: tuple[int, ...], num_devices: int | None) -> int:
    """Devices per replica group: the first group's (`_first_group`), or every device where the op
    names none."""
    if group:
        return len(group)
    if num_devices is None:
        raise ValueError(
            "collective has no explicit replica_groups (= all devices): pass num_devices"
        )
    return num_devices


def _first_group(line: str) -> tuple[int, ...]:
    """The device ids of an op's first replica group: the explicit list's first ``{...}``, or the
    iota form's ``[G,S]<=[dims]T(perm)`` (ids 0..prod(dims)-1 laid out as dims, transposed by
    perm, read as G groups of S)."""
    m = _GROUPS_IOTA.search(line)
    if m:
        import numpy as np

        ids = np.arange(math.prod(int(d) for d in m.group("dims").split(",")))
        ids = ids.reshape([int(d) for d in m.group("dims").split(",")])
        if m.group("perm"):
            ids = ids.transpose([int(p) for p in m.group("perm").split(",")])
        return tuple(int(i) for i in ids.reshape(int(m.group("g")), int(m.group("s")))[0])
    m = _GROUPS_LIST.search(line)
    if m and (first := re.search(r"\{([\d,\s]*)\}", m.group("body"))) is not None:
        return tuple(int(t) for t in first.group(1).split(",") if t.strip())
    return ()


def mesh_axes(group: Sequence[int], axis_sizes: dict[str, int]) -> tuple[str, ...]:
    """The mesh axes a replica group spans: those whose coordinate varies over its devices, the
    ids read as row-major positions in a mesh of `axis_sizes` (name -> size, in the mesh's axis
    order; what `jax.make_mesh` lays out and the HLO's global device ids index). An empty group
    (no replica_groups: every device) spans every axis of size > 1."""
    import numpy as np

    names, sizes = list(axis_sizes), [int(v) for v in axis_sizes.values()]
    if not group:
        return tuple(n for n, k in zip(names, sizes, strict=True) if k > 1)
    if max(group) >= math.prod(sizes):
        raise ValueError(
            f"replica group {tuple(group)} has a device id beyond the mesh {axis_sizes} "
            f"({math.prod(sizes)} devices): not this program's mesh"
        )
    coords = np.stack(np.unravel_index(np.asarray(group), sizes))
    return tuple(n for n, c in zip(names, coords, strict=True) if len(set(c.tolist())) > 1)


def ring_wire_bytes(kind: str, full_bytes: float, n: int) -> float:
    """Bytes each device sends for a collective over n devices whose full value has `full_bytes`.

    Ring algorithms (module docstring): all-gather / reduce-scatter / all-to-all (n-1)/n x S,
    all-reduce 2 (n-1)/n x S, collective-permute S.
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is invalid: valid values are {KINDS}")
    if n < 1:
        raise ValueError(f"n={n} is invalid: valid values are >= 1 (devices in the group)")
    if kind == "collective-permute":
        return float(full_bytes)
    f = (n - 1) / n
    return float((2 * f if kind == "all-reduce" else f) * full_bytes)


def _instruction_lines(hlo_text: str) -> Iterable[str]:
    # Instructions can be long but never span lines in HLO text dumps.
    return hlo_text.splitlines()


_COMP_HEADER = re.compile(r"^\s*(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_CALLEE = re.compile(
    r"\b(?P<attr>body|condition|calls|to_apply|true_computation|false_computation)=%?(?P<name>[\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{(?P<body>[^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(?P<n>\d+)"\}')


def _computation_of_lines(lines: Sequence[str]) -> tuple[list[str], str | None]:
    """The computation each line belongs to, and the entry computation's name."""
    owner, current, entry = [], "", None
    for line in lines:
        m = _COMP_HEADER.match(line)
        if m is not None:
            current = m.group("name")
            if m.group("entry"):
                entry = current
        owner.append(current)
    return owner, entry


def _multiplicities(lines: Sequence[str], owner: Sequence[str], entry: str | None):
    """(executions per run, all trip counts known?) of every computation reachable from entry."""
    edges: dict[str, list[tuple[str, int, bool]]] = {}
    for line, comp in zip(lines, owner, strict=True):
        callees = [(m.group("attr"), m.group("name")) for m in _CALLEE.finditer(line)]
        b = _BRANCHES.search(line)
        if b:
            callees += [("branch", n.strip().lstrip("%")) for n in b.group("body").split(",")]
        if not callees:
            continue
        trip = _TRIP.search(line)
        for attr, name in callees:
            if attr == "body":
                n, known = (int(trip.group("n")), True) if trip else (1, False)
            elif attr == "condition":
                n, known = (int(trip.group("n")) + 1, True) if trip else (1, False)
            else:
                n, known = 1, True
            edges.setdefault(comp, []).append((name, n, known))
    mult: dict[str, tuple[int, bool]] = {}

    def visit(comp: str, m: int, known: bool, depth: int) -> None:
        if depth > 64:  # HLO call graphs are acyclic; this only guards a malformed text
            return
        old_m, old_k = mult.get(comp, (0, True))
        mult[comp] = (old_m + m, old_k and known)
        for callee, n, k in edges.get(comp, ()):
            visit(callee, m * n, known and k, depth + 1)

    if entry is not None:
        visit(entry, 1, True, 0)
    return mult


def parse_collectives(hlo_text: str, num_devices: int | None = None) -> list[Collective]:
    """Every collective op of an HLO module's text (optimised, i.e. ``compiled.as_text()``).

    Async pairs count once (the ``-done`` half, whose result is the collective's output; the
    ``-start`` half is skipped). `num_devices` is needed only for ops without replica groups.
    """
    out: list[Collective] = []
    lines = list(_instruction_lines(hlo_text))
    owner, entry = _computation_of_lines(lines)
    mult = _multiplicities(lines, owner, entry)
    # The replica groups / pairs of an async pair live on its -start half.
    starts = {}
    for line in lines:
        m = _INSTR.match(line)
        if m is not None and m.group("suffix") == "-start":
            starts[m.group("name")] = line
    for line, comp in zip(lines, owner, strict=True):
        m = _INSTR.match(line)
        if m is None or m.group("suffix") == "-start":
            continue
        count, known = mult.get(comp, (1, True))
        kind, arrays = m.group("op"), _parse_arrays(m.group("shape"))
        if not arrays:
            continue
        if m.group("suffix") == "-done":
            operand = re.search(r"-done\(\s*%?([\w.\-]+)", line)
            line = starts.get(operand.group(1), line) if operand else line
        n_pairs = 0
        if kind == "collective-permute":  # source -> target pairs, no replica groups
            group: tuple[int, ...] = ()
            pm = _PAIRS.search(line)
            n_pairs = len(re.findall(r"\{\d+,\d+\}", pm.group("body"))) if pm else 0
            n = max(num_devices or 0, n_pairs, 1)
        else:
            group = _first_group(line)
            n = _group_size(group, num_devices)
        result_bytes = sum(_array_bytes(dt, dims) for dt, dims in arrays)
        # The full value: the gathered result of an all-gather, the (pre-scatter) input of a
        # reduce-scatter (n x its result), the reduced tensor of an all-reduce, the per-device
        # buffer of all-to-all / collective-permute.
        full = result_bytes * n if kind == "reduce-scatter" else result_bytes
        wire = ring_wire_bytes(kind, full, n)
        if kind == "collective-permute" and n_pairs:
            # Only the sources send; spread over the group to keep a per-device average.
            wire = full * n_pairs / n
        out.append(
            Collective(
                kind=kind,
                name=m.group("name"),
                dtype=arrays[0][0],
                shapes=tuple(dims for _, dims in arrays),
                group_size=n,
                num_pairs=n_pairs,
                payload_bytes=float(full),
                wire_bytes_per_device=float(wire),
                computation=comp,
                count=max(count, 1),
                trip_count_known=known,
                first_group=group,
            )
        )
    return out


def hlo_collectives(fn: Callable, *args: Any, **kwargs: Any) -> list[Collective]:
    """Compile ``jax.jit(fn)(*args, **kwargs)`` (or an already-jitted fn) and list its collectives.

    Args are arrays or `jax.ShapeDtypeStruct`s (with shardings where the program needs them).
    """
    import jax

    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    compiled = jitted.lower(*args, **kwargs).compile()
    return parse_collectives(compiled.as_text(), num_devices=jax.device_count())


@dataclasses.dataclass(frozen=True)
class CommSummary:
    """Totals over a program's collectives."""

    num_ops: int  # executed collectives per run (loop iterations counted)
    payload_bytes: float
    wire_bytes_per_device: float
    by_kind: dict[str, float]  # payload bytes per kind
    trip_counts_known: bool = True


def summarize(collectives: Sequence[Collective]) -> CommSummary:
    """Totals per program run: every op weighted by its `count` (loop trip counts)."""
    by_kind: dict[str, float] = {}
    for c in collectives:
        by_kind[c.kind] = by_kind.get(c.kind, 0.0) + c.count * c.payload_bytes
    return CommSummary(
        num_ops=int(sum(c.count for c in collectives)),
        payload_bytes=float(sum(c.count * c.payload_bytes for c in collectives)),
        wire_bytes_per_device=float(sum(c.count * c.wire_bytes_per_device for c in collectives)),
        by_kind=by_kind,
        trip_counts_known=all(c.trip_count_known for c in collectives),
    )


def count_collectives(fn: Callable, *args: Any, **kwargs: Any) -> CommSummary:
    """`summarize(hlo_collectives(fn, *args, **kwargs))`."""
    return summarize(hlo_collectives(fn, *args, **kwargs))


# ---------------------------------------------------------------------------------------------
# by construction


@dataclasses.dataclass(frozen=True)
class TrafficEstimate:
    """Bytes one ES generation or one RL step moves (see module docstring for the two sizes)."""

    payload_bytes: float
    wire_bytes_per_device: float
    detail: dict[str, float]


def _check_devices(num_devices: int) -> None:
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError(f"num_devices={num_devices!r} is invalid: valid values are integers >= 1")


def essa_generation_bytes(
    population_size: int,
    num_devices: int,
    *,
    fitness_bytes: int = 4,
    seed_bytes: int = 0,
    rows: int = 0,
    row_bytes: int = 16,
) -> TrafficEstimate:
    """Traffic of one ESSA generation: an all-gather of the P fitness values (ESSA, Sec. 3).

    Every device regenerates the population from the shared key, so no genome, adapter or weight
    moves. ``seed_bytes`` > 0 counts the paper's explicit (seed, reward) pairs instead (our
    implementation derives seeds from the shared key, so it ships rewards only). ``rows`` > 0
    counts what our processes gather instead of P fitness values: ``row_bytes`` per rollout
    (reward, length, finished, owned: 4 float32, `population.evaluator`), P x B rows in all.
    """
    _check_devices(num_devices)
    if population_size < 1:
        raise ValueError(f"population_size={population_size} is invalid: valid values are >= 1")
    fitness = population_size * (fitness_bytes + seed_bytes)
    full = fitness + rows * row_bytes
    return TrafficEstimate(
        payload_bytes=float(full),
        wire_bytes_per_device=ring_wire_bytes("all-gather", full, num_devices),
        detail={"fitness_allgather": float(fitness), "row_allgather": float(rows * row_bytes)},
    )


def grpo_step_bytes(
    trainable_bytes: float,
    num_devices: int,
    *,
    updates_per_step: int = 1,
    weight_sync_bytes: float = 0.0,
) -> TrafficEstimate:
    """Traffic of one data-parallel GRPO step.

    Args:
      trainable_bytes: bytes of the trainable gradient (LoRA factors, or every parameter for full
        fine-tuning), at the dtype it is all-reduced in.
      num_devices: data-parallel devices n.
      updates_per_step: optimizer updates per step (mini-batches x PPO epochs); each all-reduces
        the gradient once: 2 (n-1)/n x trainable_bytes sent per device (ring).
      weight_sync_bytes: bytes shipped from the trainer to a separate rollout engine after the
        step (the updated trainable weights; 0 when trainer and sampler share the weights, as here).
        Counted as one broadcast-like all-gather: (n-1)/n x bytes per device.
    """
    _check_devices(num_devices)
    if updates_per_step < 1:
        raise ValueError(f"updates_per_step={updates_per_step} is invalid: valid values are >= 1")
    grad = updates_per_step * trainable_bytes
    wire = updates_per_step * ring_wire_bytes("all-reduce", trainable_bytes, num_devices)
    wire += ring_wire_bytes("all-gather", weight_sync_bytes, num_devices)
    return TrafficEstimate(
        payload_bytes=float(grad + weight_sync_bytes),
        wire_bytes_per_device=float(wire),
        detail={"gradient_allreduce": float(grad), "weight_sync": float(weight_sync_bytes)},
    )
