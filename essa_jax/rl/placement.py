"""Where the data-parallel GRPO and SFT programs keep their inputs: the mesh of a trainer, the base
weights and (`essa_jax.mesh.on_mesh`) the host values every process holds identically
(docs/ARCHITECTURE.md, "Data-parallel GRPO and SFT")."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh

from essa_jax.mesh import make_mesh, on_mesh, place_params

__all__ = ["on_mesh", "one_device_mesh", "place_base"]
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
