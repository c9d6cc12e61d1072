"""The compiled programs of a run, as the ahead-of-time plan sees them (docs/ARCHITECTURE.md,
"Planning memory"): `Program` (a name, a thunk that lowers it from abstract inputs, what sizes it
and what shrinks it), `ProgramInputs` (the abstract weights, adapter and mesh every program of a
run shares) and the model's FLOP count. The plan (`essa_jax.plan`) builds the SFT step and the
held-out evaluation batch; a method (`essa_jax.train.methods`) builds its own loop's programs from
the same inputs with the objects its loop runs, so the plan compiles what the run compiles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any


@dataclasses.dataclass
class Program:
    """One compiled program of a run: `lower()` -> `jax.stages.Lowered` (None: it cannot fit, and
    `fix` says why); `mesh` its mesh's axis sizes; `chunks` the sizes that set its memory; `fix`
    the settings that shrink it (for the "does not fit" message); `model_flops` its FLOPs counted
    from the model's shape (`model_flops`)."""

    name: str
    lower: Callable[[], Any] | None
    mesh: dict[str, int]
    chunks: dict[str, int]
    fix: str
    model_flops: float = 0.0


@dataclasses.dataclass(frozen=True)
class ProgramInputs:
    """What every program of a run shares, abstract (`jax.ShapeDtypeStruct` leaves with the run's
    shardings): the experiment `config`, the model's `ModelConfig` `mc`, the target's `devices`
    and `device_memory_bytes`, the data-parallel `mesh` of SFT and GRPO (None on one device) and
    `rep` (replicated over it, or one device), the `infer_base` after SFT (`model.quantize` form,
    split over the mesh's model axis) and its unplaced shapes `infer_shape`, the float32 LoRA
    adapter `lora_shape`, the prompt width `prompt_len` (task.max_prompt_tokens), the completion
    length `new_tokens` and the stop tokens `eos`."""

    config: Any
    mc: Any
    devices: Sequence[Any]
    device_memory_bytes: int
    mesh: Any
    rep: Any
    infer_base: Any
    infer_shape: Any
    lora_shape: Any
    prompt_len: int
    new_tokens: int
    eos: tuple[int, ...]


def abstract(tree: Any, sharding: Any) -> Any:
    """`tree`'s leaves as `jax.ShapeDtypeStruct`s placed with `sharding`."""
    import jax

    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def mesh_sizes(mesh: Any) -> dict[str, int]:
    """{axis: size} of `mesh`; {"devices": 1} without one."""
    if mesh is None:
        return {"devices": 1}
    return dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))


def model_flops(
    mc, rows: int, prompt: int, new: int = 0, *, train: bool = False, remat: bool = False
) -> float:
    """FLOPs of `rows` sequences of `prompt` tokens (+ `new` decoded ones) through the model.

    Per token: 2 x (projection kernels + output head) multiply-adds, plus attention's
    4 x layers x heads x head_dim x (keys attended), causal (a token at position t sees t + 1
    keys). Generation counts prefill and every decode step; training counts the forward, the
    backward's input gradients (as much again: the base weights are frozen, the LoRA weights'
    own gradients are negligible) and, with remat, a second forward.
    """
    dense = 2 * (
        mc.num_layers * sum(i * o for i, o in mc.projection_shapes().values())
        + mc.hidden_size * mc.vocab_size
    )
    attn = 4 * mc.num_layers * mc.num_heads * mc.head_dim
    total = prompt + new
    # Sum over positions t < total of (t + 1) keys = total (total + 1) / 2.
    keys = total * (total + 1) / 2
    forward = rows * (dense * total + attn * keys)
    if not train:
        return float(forward)
    return float(forward * (3 if remat else 2))
