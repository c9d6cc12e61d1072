"""Device meshes for population evaluation: a population axis and a prompt (data) axis.

ESSA distributes candidates, not weights (arXiv 2507.04453, Sec. 3.3): every device holds the base
weights and the frozen SVD basis (replicated), and evaluates its slice of the population on its
slice of the prompts. Only genomes go in and only tokens / fitness come out.

Sizes that do not divide the mesh (our choice, documented here and in `population_generate`):
the population is padded up to a multiple of the "pop" axis with copies of member 0, and the prompts
up to a multiple of the "data" axis with copies of prompt 0; padded rows are computed and then
dropped before any output is returned, so they never reach the fitness. Padding wastes compute:
pick P divisible by the pop axis size (and B by the data axis size) for full efficiency.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

# One pair of axis names for single- and multi-process meshes (`essa_jax.distributed.global_mesh`).
from essa_jax.distributed import DATA_AXIS
from essa_jax.distributed import POPULATION_AXIS as POP_AXIS


def make_population_mesh(
    pop: int | None = None, data: int = 1, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """A `(pop, data)` mesh with Auto axis types over the first pop * data devices.

    pop defaults to len(devices) // data. Raises ValueError naming the field if the devices do not
    suffice.
    """
    devs = list(jax.devices() if devices is None else devices)
    if data < 1:
        raise ValueError(f"data must be >= 1, got {data}")
    if pop is None:
        pop = len(devs) // data
    if pop < 1 or pop * data > len(devs):
        raise ValueError(
            f"mesh pop={pop} x data={data} needs {pop * data} devices but {len(devs)} are "
            f"available; "
            f"valid: pop * data <= {len(devs)}"
        )
    grid = np.asarray(devs[: pop * data], dtype=object).reshape(pop, data)
    return Mesh(grid, (POP_AXIS, DATA_AXIS), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def mesh_sizes(mesh: Mesh | None) -> tuple[int, int]:
    """(pop axis size, data axis size); (1, 1) without a mesh."""
    if mesh is None:
        return 1, 1
    missing = {POP_AXIS, DATA_AXIS} - set(mesh.axis_names)
    if missing:
        raise ValueError(
            f"population mesh needs axes {(POP_AXIS, DATA_AXIS)}, got {mesh.axis_names}; "
            "build it with make_population_mesh"
        )
    return mesh.shape[POP_AXIS], mesh.shape[DATA_AXIS]


def padded_size(n: int, multiple: int) -> int:
    """Smallest multiple of `multiple` that is >= n."""
    return -(-n // multiple) * multiple


def replicate(tree, mesh: Mesh | None):
    """Place a pytree (base params, SVD basis) fully replicated on `mesh` (no-op without one).

    Do this once before a run: otherwise every jitted call broadcasts the weights again.
    """
    if mesh is None:
        return tree
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.device_put(tree, sharding)
