"""Which step a run's exported adapter (or full-parameter model) is from, and whether it is the
run's latest.

A run writes `<workdir>/adapter` (or `<workdir>/model`) once, when its loop ends. A finished run
resumed for more steps and stopped before its new end (a signal, `max_wall_seconds`, a crash)
leaves newer checkpoints beside the older export, and summary.json from the earlier end too:
reading that folder as "the run's result" would silently evaluate or build on a stale model. So the
export carries `essa_jax_export.json` (the step and method it was written at, inside the folder,
renamed into place with it) and its readers (`python -m essa_jax.evaluate_lm --run`,
`sft.init_from`) compare that step with the workdir's latest complete checkpoint
(`stale_export`). A folder written before the record existed is judged by modification time
(a checkpoint newer than the export makes it stale).
"""

from __future__ import annotations

import json
import os
from typing import Any

from essa_jax.checkpointing import CHECKPOINT_DIR, complete_steps

EXPORT_RECORD = "essa_jax_export.json"


def write_export_record(folder: str, step: int, method: str) -> None:
    """Record in `folder` (an export being written, before it is renamed into place) the loop
    step and method its weights are from."""
    with open(os.path.join(folder, EXPORT_RECORD), "w") as f:
        json.dump({"step": int(step), "method": method}, f)
        f.write("\n")


def read_export_record(folder: str) -> dict[str, Any] | None:
    """The record of `write_export_record` in `folder`; None when absent or unreadable (an
    export written before records existed, or not by a run)."""
    try:
        with open(os.path.join(folder, EXPORT_RECORD)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("step"), int) else None


def stale_export(folder: str, workdir: str | None = None) -> str | None:
    """One line saying why the export `folder` (default workdir: its parent) is not the run's
    latest, naming both steps and how to get a fresh one; None when it is the latest, or when
    the workdir holds no checkpoint to compare with (an adapter copied elsewhere, a PEFT folder
    of another tool)."""
    folder = os.path.abspath(folder)
    workdir = os.path.abspath(workdir or os.path.dirname(folder))
    steps = complete_steps(os.path.join(workdir, CHECKPOINT_DIR))
    if not steps:
        return None
    latest = steps[-1]
    record = read_export_record(folder)
    fresh = (
        f"resume the run to its end (python -m essa_jax.main --config <its config> --workdir "
        f"{workdir}: it rewrites {os.path.basename(folder)}/ and summary.json)"
    )
    if record is not None:
        if record["step"] == latest:
            return None
        return (
            f"{folder} is from step {record['step']}, but {workdir}'s latest checkpoint is step "
            f"{latest} (the run went on after writing it and stopped before its end); {fresh}"
        )
    try:
        written = os.path.getmtime(folder)
        newest = os.path.getmtime(os.path.join(workdir, CHECKPOINT_DIR, str(latest)))
    except OSError:
        return None
    if newest <= written:
        return None
    return (
        f"{folder} (no {EXPORT_RECORD}: written before exports recorded their step) is older than "
        f"{workdir}'s latest checkpoint, step {latest}; {fresh}"
    )
