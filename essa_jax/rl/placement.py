"""Where the data-parallel GRPO and SFT programs keep their inputs: the mesh of a trainer, the base
weights and the host values every process holds identically (docs/ARCHITECTURE.md, "Data-parallel
GRPO and SFT")."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh

from essa_jax.mesh import make_mesh, place, place_params
from essa_jax.models.config import ModelConfig


def one_device_mesh() -> Mesh:
    """The mesh of a trainer given none: this process's first device (pop = data = model = 1).
    Its programs are the data-parallel ones with a data axis of one, which adds no collective and
    no padding (`essa_jax.mesh.data_psum`)."""
    return make_mesh(pop=1, data=1, devices=jax.local_devices()[:1])


def place_base(params: Any, mesh: Mesh, model_config: ModelConfig) -> Any:
    """Base weights on `mesh` for the data-parallel GRPO / SFT programs, once per run: split over
    the ``model`` axis (tensor parallel, `essa_jax.mesh.place_params`) and replicated over
    ``data``. The programs are manual over ``data`` only and keep ``model`` Auto, so XLA runs the
    layers tensor-parallel from the weights' shardings (docs/ARCHITECTURE.md, "Tensor
    parallelism")."""
    return place_params(params, mesh, model_config)


def on_mesh(tree: Any, mesh: Mesh) -> Any:
    """`tree` as global arrays on `mesh`: leaves already spread over exactly the mesh's devices
    (replicated, or split over ``model`` by `place_base`) are kept, others are placed replicated
    (`mesh.place`: every process holds them identically, nothing travels)."""
    devices = set(mesh.devices.flat)

    def put(x: Any) -> Any:
        if isinstance(x, jax.Array) and x.sharding.device_set == devices:
            return x
        return place(x, mesh)

    return jax.tree.map(put, tree)
