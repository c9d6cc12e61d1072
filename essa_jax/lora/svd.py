"""SVD reparametrisation of LoRA adapters and the genome <-> adapter mapping (ESSA).

ESSA (arXiv 2507.04453, Sec. 3.1, Eq. 2-3) factorises each LoRA factor separately,

    A = U_A diag(s_A) V_A^T   (A: r x in),      B = U_B diag(s_B) V_B^T   (B: out x r),

freezes U and V and searches only over the singular values. With M = U_A^T V_B (r x r, frozen) the
adapted projection of a row vector x is (docs/ARCHITECTURE.md, "Population")

    y = x W + scale * ((((x V_A) * s_A) M) * s_B) U_B^T,

so a population that differs only in (s_A, s_B) shares every matrix and differs only by two
diagonal scalings inside the low-rank path.

Genome (our choice; the paper gives only its length): a flat vector of offsets added to the SFT
singular values, so the zero genome is the SFT adapter. With alpha_frac < 1 only the
k = ceil(alpha_frac * r) largest singular values of each factor are searched (the paper's alpha);
the others stay at their SFT value. The order of the genome is target-major (targets sorted
by name, the order in which jax flattens dicts: "down", "gate", "k", "o", "q", "up", "v"), then
factor (A before B), then layer, then singular-value index (largest
first):

    genome = concat_t concat_{f in (A, B)} (offsets[t, f] of shape [L, k]).ravel()

`GenomeLayout` names every slice (`segment`, `index`, `describe`). Genome length is
len(targets) * 2 * L * k, e.g. 30 layers x 4 targets x 2 factors x rank 8 = 1920 for SmolLM2-135M.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from essa_jax.lora.adapter import LoRA
from essa_jax.lora.config import VALID_TARGETS
from essa_jax.models.transformer import FUSED_LORA_TARGETS

FACTORS = ("a", "b")


@flax.struct.dataclass
class SVDLoRA:
    """A LoRA adapter in SVD form, one projection, stacked over layers (model LoRA hook).

    Attributes:
      v_a: `[L, in, r]` V_A (frozen).
      m: `[L, r, r]` U_A^T V_B (frozen).
      u_b: `[L, out, r]` U_B (frozen).
      s_a, s_b: `[L, r]` singular values of one adapter, or `[L, N, r]` per row of the batch
        (row n of x uses s[:, n]); the population is N = P * B rows, member i owning rows
        i*B .. i*B + B - 1.
      scale: alpha / r as in the LoRA it came from (static).
    """

    v_a: jax.Array
    m: jax.Array
    u_b: jax.Array
    s_a: jax.Array
    s_b: jax.Array
    scale: float = flax.struct.field(pytree_node=False, default=1.0)

    def delta(self, x: jax.Array) -> jax.Array:
        """scale * ((((x V_A) * s_A) M) * s_B) U_B^T, one layer: x `[N, .., in]` -> `[N, .., out]`.

        Inside a layer, s is `[r]` (shared) or `[N, r]` (per row, broadcast over x's middle axes).
        """
        dt = x.dtype

        def rows(s: jax.Array) -> jax.Array:
            s = s.astype(dt)
            if s.ndim == 1:
                return s
            if x.ndim < 2 or s.shape[0] != x.shape[0]:
                raise ValueError(
                    f"SVDLoRA per-row singular values {s.shape} need x with {s.shape[0]} rows on "
                    f"axis 0, got x {x.shape}"
                )
            return s.reshape(s.shape[:1] + (1,) * (x.ndim - 2) + s.shape[1:])

        # The scale rides on s_B (r numbers per row) rather than on the [.., out] output.
        h = jnp.einsum("...i,ir->...r", x, self.v_a.astype(dt)) * rows(self.s_a)
        h = jnp.einsum("...r,rq->...q", h, self.m.astype(dt)) * rows(self.scale * self.s_b)
        return jnp.einsum("...q,oq->...o", h, self.u_b.astype(dt)).astype(dt)


@flax.struct.dataclass
class SVDFactors:
    """The frozen SVD of one target's LoRA factors, plus its SFT singular values.

    Shapes: u_a `[L, r, r]`, s_a `[L, r]`, v_a `[L, in, r]`, u_b `[L, out, r]`, s_b `[L, r]`,
    v_b `[L, r, r]`, m = U_A^T V_B `[L, r, r]`. Singular values are sorted, largest first.
    """

    u_a: jax.Array
    s_a: jax.Array
    v_a: jax.Array
    u_b: jax.Array
    s_b: jax.Array
    v_b: jax.Array
    m: jax.Array
    scale: float = flax.struct.field(pytree_node=False, default=1.0)


@flax.struct.dataclass
class SVDBasis:
    """Frozen SVD of every adapted target: `{target: SVDFactors}` (a pytree; replicate it)."""

    factors: dict[str, SVDFactors]


@dataclasses.dataclass(frozen=True)
class Segment:
    """Genome slice [start, stop) holding offsets of factor `factor` of `target`, shaped [L, k]."""

    target: str
    factor: str
    start: int
    stop: int


@dataclasses.dataclass(frozen=True)
class GenomeLayout:
    """Where each singular value lives in the flat genome (hashable: a valid jit static arg).

    Attributes:
      targets: adapted projections, in genome order.
      num_layers: L.
      rank: r.
      num_free: k = ceil(alpha_frac * r), searched singular values per factor (the largest k).
    """

    targets: tuple[str, ...]
    num_layers: int
    rank: int
    num_free: int

    def __post_init__(self) -> None:
        if not 1 <= self.num_free <= self.rank:
            raise ValueError(f"GenomeLayout.num_free={self.num_free} must be in 1..{self.rank}")

    @property
    def block(self) -> int:
        return self.num_layers * self.num_free

    @property
    def size(self) -> int:
        """D, the genome length: len(targets) * 2 * L * k."""
        return len(self.targets) * len(FACTORS) * self.block

    @property
    def segments(self) -> tuple[Segment, ...]:
        out = []
        for ti, t in enumerate(self.targets):
            for fi, f in enumerate(FACTORS):
                start = (ti * len(FACTORS) + fi) * self.block
                out.append(Segment(t, f, start, start + self.block))
        return tuple(out)

    def segment(self, target: str, factor: str) -> Segment:
        if target not in self.targets or factor not in FACTORS:
            raise ValueError(
                f"no genome segment for target={target!r}, factor={factor!r}; targets: "
                f"{self.targets}, factors: {FACTORS}"
            )
        return self.segments[self.targets.index(target) * len(FACTORS) + FACTORS.index(factor)]

    def index(self, target: str, factor: str, layer: int, j: int) -> int:
        """Genome position of singular value j (0 = largest) of `factor` of `target` in `layer`."""
        if not (0 <= layer < self.num_layers and 0 <= j < self.num_free):
            raise ValueError(
                f"layer={layer}, j={j} out of range (layers 0..{self.num_layers - 1}, "
                f"searched singular values 0..{self.num_free - 1})"
            )
        return self.segment(target, factor).start + layer * self.num_free + j

    def describe(self, i: int) -> tuple[str, str, int, int]:
        """Inverse of `index`: genome position i -> (target, factor, layer, j)."""
        if not 0 <= i < self.size:
            raise ValueError(f"genome index {i} out of range 0..{self.size - 1}")
        seg_i, rest = divmod(i, self.block)
        t_i, f_i = divmod(seg_i, len(FACTORS))
        layer, j = divmod(rest, self.num_free)
        return self.targets[t_i], FACTORS[f_i], layer, j

    def split(self, genome: jax.Array) -> dict[str, dict[str, jax.Array]]:
        """genome `[..., D]` -> {target: {factor: offsets [..., L, k]}}."""
        if genome.shape[-1] != self.size:
            raise ValueError(f"genome has length {genome.shape[-1]}, this layout needs {self.size}")
        lead = genome.shape[:-1]
        out: dict[str, dict[str, jax.Array]] = {}
        for seg in self.segments:
            part = genome[..., seg.start : seg.stop].reshape(
                lead + (self.num_layers, self.num_free)
            )
            out.setdefault(seg.target, {})[seg.factor] = part
        return out

    def join(self, parts: dict[str, dict[str, jax.Array]]) -> jax.Array:
        """Inverse of `split`: {target: {factor: [..., L, k]}} -> genome `[..., D]`."""
        pieces = []
        for seg in self.segments:
            p = jnp.asarray(parts[seg.target][seg.factor])
            if p.shape[-2:] != (self.num_layers, self.num_free):
                raise ValueError(
                    f"offsets for {seg.target}/{seg.factor} have shape {p.shape}, expected "
                    f"[..., {self.num_layers}, {self.num_free}]"
                )
            pieces.append(p.reshape(p.shape[:-2] + (self.block,)))
        return jnp.concatenate(pieces, axis=-1)


def num_free_values(rank: int, alpha_frac: float) -> int:
    """k = ceil(alpha_frac * r): how many of a factor's singular values the genome holds."""
    if not (isinstance(alpha_frac, int | float) and 0.0 < alpha_frac <= 1.0):
        raise ValueError(f"alpha_frac must be in (0, 1], got {alpha_frac!r}")
    # The small tolerance keeps e.g. 0.3 * 10 = 3.0000000000000004 from rounding up to 4.
    return max(1, min(rank, math.ceil(alpha_frac * rank - 1e-9)))


def canonical_targets(targets) -> tuple[str, ...]:
    """Targets in genome order: sorted by name, as jax flattens dicts (so an adapter dict that went
    through jit, tree.map or a checkpoint keeps the same order)."""
    unknown = set(targets) - set(VALID_TARGETS)
    if unknown:
        raise ValueError(f"unknown targets {sorted(unknown)}; valid: {VALID_TARGETS}")
    return tuple(sorted(targets))


def genome_layout(targets, num_layers: int, rank: int, alpha_frac: float = 1.0) -> GenomeLayout:
    """The GenomeLayout of adapters on `targets` (any order: the genome's is `canonical_targets`)
    with `num_layers` layers of rank `rank`, searching ceil(alpha_frac * r) values per factor:
    the layout `svd_factorize` returns for such adapters, known before they exist."""
    return GenomeLayout(
        targets=canonical_targets(targets),
        num_layers=num_layers,
        rank=rank,
        num_free=num_free_values(rank, alpha_frac),
    )


def svd_factorize(lora: dict[str, LoRA], alpha_frac: float = 1.0) -> tuple[SVDBasis, GenomeLayout]:
    """Thin SVD of each factor of each adapter (ESSA Eq. 2), computed on host in float64.

    Args:
      lora: `{target: LoRA(a [L, r, in], b [L, out, r])}`, all with the same L and r (an SFT
        adapter; a fresh one has B = 0, hence s_B = 0 and an arbitrary U_B: ESSA needs the SFT
        warm start).
      alpha_frac: fraction of each factor's singular values in the genome (paper's alpha).

    Returns: (basis, layout); basis arrays have the adapters' dtype.
    """
    if not lora:
        raise ValueError("svd_factorize needs at least one adapter")
    shapes = {t: (ad.a.shape[0], ad.a.shape[1]) for t, ad in lora.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"all adapters need the same (layers, rank); got {shapes}")
    num_layers, rank = next(iter(shapes.values()))
    factors = {}
    for t, ad in lora.items():
        dtype = ad.a.dtype
        a = np.asarray(ad.a, np.float64)
        b = np.asarray(ad.b, np.float64)
        u_a, s_a, vt_a = np.linalg.svd(a, full_matrices=False)  # [L,r,r], [L,r], [L,r,in]
        u_b, s_b, vt_b = np.linalg.svd(b, full_matrices=False)  # [L,out,r], [L,r], [L,r,r]
        v_a = np.swapaxes(vt_a, -1, -2)
        v_b = np.swapaxes(vt_b, -1, -2)
        m = np.swapaxes(u_a, -1, -2) @ v_b
        arr = lambda z, dtype=dtype: jnp.asarray(z, dtype)
        factors[t] = SVDFactors(
            u_a=arr(u_a),
            s_a=arr(s_a),
            v_a=arr(v_a),
            u_b=arr(u_b),
            s_b=arr(s_b),
            v_b=arr(v_b),
            m=arr(m),
            scale=ad.scale,
        )
    return SVDBasis(factors=factors), genome_layout(lora, num_layers, rank, alpha_frac)


def basis_shape(lora: dict[str, Any], alpha_frac: float = 1.0) -> tuple[SVDBasis, GenomeLayout]:
    """`svd_factorize`'s (basis, layout) as shapes only: `jax.ShapeDtypeStruct` leaves, nothing
    computed (adapters given as arrays or shapes). For ahead-of-time compilation (`essa_jax.plan`).
    """
    factors = {}
    for t, ad in lora.items():
        num_layers, rank, fan_in = ad.a.shape
        fan_out = ad.b.shape[1]

        def sds(*shape, dtype=ad.a.dtype):
            return jax.ShapeDtypeStruct(shape, dtype)

        factors[t] = SVDFactors(
            u_a=sds(num_layers, rank, rank),
            s_a=sds(num_layers, rank),
            v_a=sds(num_layers, fan_in, rank),
            u_b=sds(num_layers, fan_out, rank),
            s_b=sds(num_layers, rank),
            v_b=sds(num_layers, rank, rank),
            m=sds(num_layers, rank, rank),
            scale=ad.scale,
        )
    num_layers, rank = next(iter(lora.values())).a.shape[:2]
    return SVDBasis(factors=factors), genome_layout(lora, num_layers, rank, alpha_frac)


def _check(basis: SVDBasis, layout: GenomeLayout) -> None:
    # Compare as sets: pytree flattening (jit, tree.map) re-orders dict keys.
    if set(basis.factors) != set(layout.targets):
        raise ValueError(
            f"basis targets {tuple(basis.factors)} differ from layout targets {layout.targets}"
        )


def genome_to_singular_values(
    basis: SVDBasis, layout: GenomeLayout, genome: jax.Array
) -> dict[str, tuple[jax.Array, jax.Array]]:
    """Singular values of the candidate(s): genome `[..., D]` -> {target: (s_a, s_b) [..., L, r]}.

    s = s_SFT + offsets on the first k values; the rest are the SFT values (alpha_frac < 1).
    """
    _check(basis, layout)
    parts = layout.split(jnp.asarray(genome))
    pad = layout.rank - layout.num_free
    out = {}
    for t, fac in basis.factors.items():
        svals = []
        for f, s0 in (("a", fac.s_a), ("b", fac.s_b)):
            off = parts[t][f].astype(s0.dtype)
            off = jnp.pad(off, [(0, 0)] * (off.ndim - 1) + [(0, pad)])
            svals.append(s0 + off)
        out[t] = (svals[0], svals[1])
    return out


def genome_to_svd_lora(
    basis: SVDBasis, layout: GenomeLayout, genome: jax.Array
) -> dict[str, SVDLoRA]:
    """One candidate as model adapters: genome `[D]` -> {target: SVDLoRA with s `[L, r]`}."""
    if jnp.ndim(genome) != 1:
        raise ValueError(f"genome must be [D], got shape {jnp.shape(genome)}")
    svals = genome_to_singular_values(basis, layout, genome)
    return {
        t: SVDLoRA(v_a=f.v_a, m=f.m, u_b=f.u_b, s_a=svals[t][0], s_b=svals[t][1], scale=f.scale)
        for t, f in basis.factors.items()
    }


def population_svd_lora(
    basis: SVDBasis, layout: GenomeLayout, genomes: jax.Array, rows_per_member: int
) -> dict[str, SVDLoRA]:
    """A population as one batched adapter: genomes `[P, D]` -> SVDLoRA with s `[L, P*B, r]`.

    Row n of the batch belongs to member n // B (B = rows_per_member), so the model input is the
    members' prompt batches stacked member-major, `[P * B, T]`. U, V, M are shared, not copied.
    """
    if jnp.ndim(genomes) != 2:
        raise ValueError(f"genomes must be [P, D], got shape {jnp.shape(genomes)}")
    if rows_per_member < 1:
        raise ValueError(f"rows_per_member must be >= 1, got {rows_per_member}")
    svals = genome_to_singular_values(basis, layout, genomes)  # [P, L, r]

    def rows(s: jax.Array) -> jax.Array:
        s = jnp.repeat(s, rows_per_member, axis=0)  # [P*B, L, r], member-major
        return jnp.swapaxes(s, 0, 1)  # [L, P*B, r]: the layer axis leads for the model's scan

    return {
        t: SVDLoRA(
            v_a=f.v_a,
            m=f.m,
            u_b=f.u_b,
            s_a=rows(svals[t][0]),
            s_b=rows(svals[t][1]),
            scale=f.scale,
        )
        for t, f in basis.factors.items()
    }


def _block_diag(mats: list[jax.Array]) -> jax.Array:
    """Block-diagonal of `[..., m_i, n_i]` (same leading axes) -> `[..., sum m, sum n]`."""
    rows = []
    col_sizes = [m.shape[-1] for m in mats]
    for i, m in enumerate(mats):
        pad = [(0, 0)] * (m.ndim - 1) + [(sum(col_sizes[:i]), sum(col_sizes[i + 1 :]))]
        rows.append(jnp.pad(m, pad))
    return jnp.concatenate(rows, axis=-2)


def fuse_shared_input(lora: dict[str, SVDLoRA]) -> dict[str, SVDLoRA]:
    """Merge the SVD adapters of projections that read the same input into one fused adapter.

    For each group of the model's FUSED_LORA_TARGETS ("qkv" = q, k, v; "gate_up" = gate, up) whose
    members are all present, the fused adapter has V_A = [V_A1 | V_A2 | ..] `[L, in, sum r]`,
    M and U_B block-diagonal, s_A and s_B concatenated, and each member's scale folded into its
    s_B. Its delta is the members' deltas concatenated along the output axis (exactly: the blocks
    do not mix), and the model splits it back (`models.transformer._proj_shared_input`). Same
    function, fewer and wider matmuls: one `[in, 3r]` instead of three `[in, r]` for q/k/v.
    Groups with a member missing are left as they are.
    """
    out = dict(lora)
    for fused, names in FUSED_LORA_TARGETS.items():
        if not all(n in out and isinstance(out[n], SVDLoRA) for n in names):
            continue
        parts = [out.pop(n) for n in names]
        out[fused] = SVDLoRA(
            v_a=jnp.concatenate([f.v_a for f in parts], axis=-1),
            m=_block_diag([f.m for f in parts]),
            u_b=_block_diag([f.u_b for f in parts]),
            s_a=jnp.concatenate([f.s_a for f in parts], axis=-1),
            s_b=jnp.concatenate([f.scale * f.s_b for f in parts], axis=-1),
            scale=1.0,
        )
    return out


def svd_lora_to_lora(basis: SVDBasis, layout: GenomeLayout, genome: jax.Array) -> dict[str, LoRA]:
    """Dense PEFT factors of one candidate (for export or merging): genome `[D]` -> {target: LoRA}.

    A' = U_A diag(s_A') V_A^T `[L, r, in]`, B' = U_B diag(s_B') V_B^T `[L, out, r]`.
    """
    if jnp.ndim(genome) != 1:
        raise ValueError(f"genome must be [D], got shape {jnp.shape(genome)}")
    svals = genome_to_singular_values(basis, layout, genome)
    out = {}
    for t, f in basis.factors.items():
        s_a, s_b = svals[t]
        a = jnp.einsum("lrk,lk,lik->lri", f.u_a, s_a, f.v_a)
        b = jnp.einsum("lok,lk,lrk->lor", f.u_b, s_b, f.v_b)
        out[t] = LoRA(a=a, b=b, scale=f.scale)
    return out


def sft_genome(layout: GenomeLayout, dtype=jnp.float32) -> jax.Array:
    """The zero genome `[D]`: the SFT adapter itself (CMA-ES's initial mean)."""
    return jnp.zeros((layout.size,), dtype)
