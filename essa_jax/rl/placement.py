"""Where the data-parallel GRPO and SFT programs keep their inputs: the mesh of a trainer, the base
weights and (`essa_jax.mesh.on_mesh`) the host values every process holds identically
(docs/ARCHITECTURE.md, "Data-parallel GRPO and SFT")."""

from __future__ import annotations

from typing import Any

import jax
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from essa_jax.mesh import (
    DATA_AXIS,
    MODEL_AXIS,
    axis_size,
    make_mesh,
    on_mesh,
    param_specs,
    place_params,
)

__all__ = [
    "on_mesh",
    "one_device_mesh",
    "place_base",
    "zero_init",
    "zero_placement",
    "zero_specs",
]
from essa_jax.models.config import ModelConfig


def one_device_mesh() -> Mesh:
    """The mesh of a trainer given none: this process's first device (pop = data = model = 1).
    Its programs are the data-parallel ones with a data axis of one, which adds no collective and
    no padding (`essa_jax.mesh.data_psum`)."""
    return make_mesh(pop=1, data=1, devices=jax.local_devices()[:1])


def place_base(
    params: Any, mesh: Mesh, model_config: ModelConfig, *, shard_data: bool = False
) -> Any:
    """Base weights on `mesh` for the data-parallel GRPO / SFT programs, once per run: split over
    the ``model`` axis (tensor parallel, `essa_jax.mesh.place_params`) and replicated over
    ``data``, or with `shard_data` (full-parameter training: the base is then only the KL
    reference and the frozen leaves) split over ``data`` too. The programs are manual over
    ``data`` only and keep ``model`` Auto, so XLA runs the layers tensor-parallel from the
    weights' shardings (docs/ARCHITECTURE.md, "Tensor parallelism")."""
    return place_params(params, mesh, model_config, shard_data=shard_data)


def zero_specs(trainable: Any, mesh: Mesh, model_config: ModelConfig) -> Any:
    """`PartitionSpec`s of full-parameter training's trainable on `mesh`: `mesh.param_specs` over
    (``model``, ``data``), each of the data devices holding 1/data of every leaf it can split
    (ZeRO, Rajbhandari et al. 2020, arXiv 1910.02054; docs/ARCHITECTURE.md, "Full-parameter
    training")."""
    model, data = axis_size(mesh, MODEL_AXIS), axis_size(mesh, DATA_AXIS)
    return param_specs(trainable, model_config, model, data)


def zero_placement(
    trainable: Any,
    opt_state: Any,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    model_config: ModelConfig,
) -> tuple[Any, Any]:
    """`NamedSharding`s of (trainable, optimiser state) split as `zero_specs`: each AdamW moment
    as its weight (`optax.tree_map_params`), the step counters replicated."""
    named = jax.tree.map(
        lambda s: NamedSharding(mesh, s), zero_specs(trainable, mesh, model_config)
    )
    opt = optax.tree_map_params(
        optimizer,
        lambda _, sh: sh,
        opt_state,
        named,
        transform_non_params=lambda _: NamedSharding(mesh, P()),
    )
    return named, opt


def zero_init(
    trainable: Any,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    model_config: ModelConfig,
) -> tuple[Any, Any]:
    """(float32 masters, optimiser state) of full-parameter training made directly split as
    `zero_placement` says: the given weights (any dtype, on the host or one device) are placed
    shard by shard (`mesh.place`), then upcast (`lora.master_weights`) and the AdamW state
    initialised on the shards, so no device ever holds a whole float32 copy or whole moments
    (Qwen2.5-7B: 30 GB of masters, 61 GB of m and v)."""
    from essa_jax.lora.adapter import master_weights
    from essa_jax.mesh import place

    masters_abs = jax.eval_shape(master_weights, trainable)
    t_sh, o_sh = zero_placement(
        masters_abs, jax.eval_shape(optimizer.init, masters_abs), optimizer, mesh, model_config
    )
    split = jax.tree.map(lambda x, sh: place(x, mesh, sh.spec), trainable, t_sh)
    masters = jax.jit(master_weights, out_shardings=t_sh)(split)
    return masters, jax.jit(optimizer.init, out_shardings=o_sh)(masters)
