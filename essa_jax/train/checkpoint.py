"""Checkpoints that resume a run exactly: orbax CheckpointManager, arrays + a JSON item.

A checkpoint at step t holds the whole loop state after t steps (strategy or optimiser state,
adapter / SVD basis, PRNG key, data cursor, counters) as a pytree, plus a JSON item (metrics
history, SFT results, elapsed wall-clock). Step 0 is the state right after SFT, so a resumed run
never repeats SFT. Orbax writes into a temporary directory and renames it when complete (atomic
finalize); `latest_step` only ever sees finished checkpoints.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

CHECKPOINT_DIR = "checkpoints"


class Checkpointer:
    """Save / restore `(state pytree, meta dict)` pairs under `<workdir>/checkpoints/<step>`."""

    def __init__(self, workdir: str, keep: int = 2):
        directory = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self._mgr = ocp.CheckpointManager(directory, options=options, item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        return self._mgr.latest_step()

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Write checkpoint `step` (blocks until it is finalised on disk)."""
        self._mgr.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )
        self._mgr.wait_until_finished()

    def restore(self, step: int, template: Any) -> tuple[Any, dict[str, Any]]:
        """State (with the structure, shapes and dtypes of `template`) and meta of `step`.

        `template` may be abstract (`jax.eval_shape` output): nothing is computed to restore.
        """
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        out = self._mgr.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
            ),
        )
        return out["state"], dict(out["meta"])

    def close(self) -> None:
        self._mgr.wait_until_finished()
        self._mgr.close()
