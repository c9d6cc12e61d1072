"""Checkpoints that resume a run exactly: orbax CheckpointManager, arrays + a JSON item.

A checkpoint at step t holds the whole loop state after t steps (strategy or optimiser state,
adapter / SVD basis, PRNG key, data cursor, counters) as a pytree, plus a JSON item (metrics
history, SFT results, elapsed wall-clock). Step 0 is the state right after SFT, so a resumed run
never repeats SFT. Orbax writes into a temporary directory and renames it when complete (atomic
finalize); `latest_step` only ever sees finished checkpoints.

Several processes: every process calls `save` / `restore` (orbax is collective). Each holds the
same state on its own devices, so the leaves are saved as global arrays replicated over every
process's devices (orbax writes one replica, from process 0) and restored onto this process's
first local device.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

CHECKPOINT_DIR = "checkpoints"


class Checkpointer:
    """Save / restore `(state pytree, meta dict)` pairs under `<workdir>/checkpoints/<step>`."""

    def __init__(self, workdir: str, keep: int = 2):
        directory = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self.directory = directory
        self._mgr = ocp.CheckpointManager(directory, options=options, item_names=("state", "meta"))

    def reload(self) -> None:
        """Re-read the step list from disk (after steps were renamed or removed)."""
        self._mgr.reload()

    def latest_step(self) -> int | None:
        return self._mgr.latest_step()

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Write checkpoint `step` (blocks until it is finalised on disk)."""
        self._mgr.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(_to_global(state)), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )
        self._mgr.wait_until_finished()

    def restore(self, step: int, template: Any) -> tuple[Any, dict[str, Any]]:
        """State (with the structure, shapes and dtypes of `template`) and meta of `step`.

        `template` may be abstract (`jax.eval_shape` output): nothing is computed to restore.
        """
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        sharding = _replicated()
        if sharding is not None:
            abstract = jax.tree.map(
                lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), abstract
            )
        out = self._mgr.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
            ),
        )
        state = out["state"]
        if sharding is not None:
            state = jax.tree.map(lambda a: a.addressable_data(0), state)
        return state, dict(out["meta"])

    def close(self) -> None:
        self._mgr.wait_until_finished()
        self._mgr.close()


def _replicated() -> NamedSharding | None:
    """Replicated over every process's devices; None with one process (arrays stay as they are)."""
    if jax.process_count() == 1:
        return None
    mesh = Mesh(np.asarray(jax.devices()), ("all",), axis_types=(AxisType.Auto,))
    return NamedSharding(mesh, PartitionSpec())


def _to_global(tree: Any) -> Any:
    """Process-local leaves (identical on every process) -> global replicated arrays."""
    sharding = _replicated()
    if sharding is None:
        return tree

    def put(x: Any) -> Any:
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

    return jax.tree.map(put, tree)
