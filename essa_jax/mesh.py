"""The one device mesh of every program, the one padding rule, and host values placed on it.

Every compiled program of a run (population generation, and later held-out evaluation, SFT and GRPO
steps) runs on a mesh built by `make_mesh`, with the same three axis names (docs/ARCHITECTURE.md,
"Meshes"):

- ``pop``: ESSA population members. ESSA distributes candidates, not weights (arXiv 2507.04453,
  Sec. 3): each device generates for its slice of members against shared base weights;
- ``data``: prompts (a member's mini-batch, or a GRPO batch);
- ``model``: tensor parallelism over heads / MLP columns; size 1 until a sharded model exists
  (`config.mesh.model` rejects anything else).

Axis types are Auto (sharding propagation decides the layout of intermediate values; the
population program fixes its own with shard_map). The device order is `jax.devices()`' (process-
major), so each process's devices hold a contiguous block of members: a process reads back and
scores only its own rows.

Padding (the one rule of the library): a size that does not divide its mesh axis is padded up to
the next multiple with copies of entry 0 (member 0, prompt 0); padded rows are computed and then
dropped before any result leaves the program's caller. Pick P divisible by the ``pop`` axis (and
B by ``data``) to waste nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

POP_AXIS = "pop"
DATA_AXIS = "data"
MODEL_AXIS = "model"
AXES = (POP_AXIS, DATA_AXIS, MODEL_AXIS)


def make_mesh(
    *,
    pop: int | None = None,
    data: int = 1,
    model: int = 1,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """A (pop, data, model) mesh with Auto axis types over `devices` (default: every process's).

    Args:
      pop: devices along the population axis; default all devices / (data * model).
      data: devices along the prompt axis.
      model: devices along the model (tensor-parallel) axis.
      devices: the devices, in mesh order (default `jax.devices()`); the first pop * data * model
        are used.

    Raises ValueError naming the axis and the valid values when the devices do not fit.
    """
    devs = list(jax.devices() if devices is None else devices)
    n = len(devs)
    for name, size in (("data", data), ("model", model)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"mesh {name}={size!r} is invalid: valid values are integers >= 1")
    if n % (data * model):
        raise ValueError(
            f"mesh data={data} x model={model} does not divide the {n} devices; valid: "
            f"data * model in {[d for d in range(1, n + 1) if n % d == 0]}"
        )
    if pop is None:
        pop = n // (data * model)
    if isinstance(pop, bool) or not isinstance(pop, int) or pop < 1 or pop * data * model > n:
        raise ValueError(
            f"mesh pop={pop!r} x data={data} x model={model} needs more than the {n} devices "
            f"available; valid pop values: 1..{n // (data * model)}"
        )
    grid = np.asarray(devs[: pop * data * model], dtype=object).reshape(pop, data, model)
    return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * 3)


def axis_size(mesh: Mesh | None, axis: str) -> int:
    """Size of `axis` in `mesh`; 1 without a mesh or when the mesh lacks the axis."""
    if mesh is None or axis not in mesh.shape:
        return 1
    return int(mesh.shape[axis])


def padded_size(n: int, multiple: int) -> int:
    """Smallest multiple of `multiple` that is >= n."""
    return -(-n // multiple) * multiple


def pad_to(x: jax.Array, size: int, axis: int = 0) -> jax.Array:
    """`x` padded along `axis` to `size` with copies of its entry 0 (the one padding rule)."""
    n = x.shape[axis]
    if n == size:
        return x
    if n > size:
        raise ValueError(f"cannot pad an axis of {n} entries down to {size}")
    first = jax.lax.slice_in_dim(x, 0, 1, axis=axis)
    return jnp.concatenate([x, jnp.repeat(first, size - n, axis=axis)], axis=axis)


def place(tree: Any, mesh: Mesh, spec: PartitionSpec | None = None) -> Any:
    """A pytree that every process holds identically (base weights, the SVD basis, a population
    regenerated from the shared key) as global arrays on `mesh` with `spec` (default replicated).

    Nothing travels between processes: each fills its own devices' shards from its local copy.
    Do this once for the weights: a jitted call would otherwise transfer them on every call.
    """
    sharding = NamedSharding(mesh, PartitionSpec() if spec is None else spec)
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)

    def put(x: Any) -> jax.Array:
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

    return jax.tree.map(put, tree)
