"""What a run writes while it trains: JSONL rows, TensorBoard events, a progress bar.

Every row carries the same axes, whatever the method: `step`, `wall_s` (seconds of the ES /
RL phase, summed over resumed segments) and `tokens` (generated tokens so far); the loop's "train"
and "eval" rows also `rollouts` (completions generated so far: ESSA's candidates x prompts, GRPO's
prompts x group), so ESSA and GRPO runs overlay directly (`python -m essa_jax.plot runs/`).
`phase` is "sft", "train" or "eval".
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

METRICS_FILE = "metrics.jsonl"
# Sample completions of every held-out evaluation, appended (`MetricsLogger.write_samples`).
EVAL_SAMPLES_FILE = "eval_samples.jsonl"


def _plain(v: Any) -> Any:
    """JSON-friendly scalars (numpy / jax 0-d arrays -> float / int)."""
    if isinstance(v, bool | int | str) or v is None:
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    a = np.asarray(v)
    if a.ndim == 0:
        x = a.item()
        return _plain(x)
    return [_plain(x) for x in a.tolist()]


class MetricsLogger:
    """Appends rows to `<workdir>/metrics.jsonl` and scalars to TensorBoard (`<workdir>/tb`).

    `history` holds every row written; on resume the logger is rebuilt from the checkpoint's
    history (`restore`), so rows written after the checkpoint by an interrupted run are dropped.
    `write_files=False` (processes other than 0 of a multi-process run) keeps the history only.
    """

    def __init__(self, workdir: str, *, tensorboard: bool = True, write_files: bool = True):
        self.write_files = write_files
        if write_files:
            os.makedirs(workdir, exist_ok=True)
        self.path = os.path.join(workdir, METRICS_FILE)
        self.samples_path = os.path.join(workdir, EVAL_SAMPLES_FILE)
        self.history: list[dict[str, Any]] = []
        self._tb = None
        self._tb_dir = os.path.join(workdir, "tb") if tensorboard and write_files else None

    def restore(self, history: Iterable[dict[str, Any]], purge_step: int | None = None) -> None:
        """Start from `history` (from a checkpoint): rewrite the JSONL file with exactly it."""
        from essa_jax.workdir import write_text_atomic

        self.history = [dict(r) for r in history]
        if self.write_files:
            # Whole or not at all: a full disk must not truncate the rows already written.
            write_text_atomic(self.path, "".join(json.dumps(row) + "\n" for row in self.history))
        self._open_tb(purge_step)

    def start(self) -> None:
        """A fresh run: truncate the JSONL file."""
        self.restore([], purge_step=None)

    def _open_tb(self, purge_step: int | None) -> None:
        if self._tb_dir is None:
            return
        from tensorboardX import SummaryWriter

        # purge_step drops events an interrupted run wrote after its last checkpoint.
        self._tb = SummaryWriter(self._tb_dir, purge_step=purge_step, flush_secs=10)

    def write(self, phase: str, step: int, **metrics: Any) -> dict[str, Any]:
        row = {"phase": phase, "step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        self.history.append(row)
        if self.write_files:
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in row.items():
                if k in ("phase", "step") or not isinstance(v, int | float) or isinstance(v, bool):
                    continue
                self._tb.add_scalar(f"{phase}/{k}", v, global_step=int(step))
        return row

    def write_samples(self, step: int, evaluation: str, samples: Iterable[dict[str, Any]]) -> None:
        """Append one held-out evaluation's sample completions ({prompt, completion, answer,
        reward}) to `<workdir>/eval_samples.jsonl`, one line each, tagged with `step` and
        `evaluation` (which one: "base", "sft", "periodic", "final"). Appended, never rewritten:
        a resumed run repeats the evaluations after its checkpoint, with their step."""
        if not self.write_files:
            return
        with open(self.samples_path, "a") as f:
            for s in samples:
                row = {
                    "step": int(step),
                    "evaluation": evaluation,
                    **{k: _plain(v) for k, v in s.items()},
                }
                f.write(json.dumps(row) + "\n")

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None


# Fields that measure the machine rather than the run: every `*_s` (seconds: wall_s, cpu_s,
# step_s, ...; rates: tokens_per_s, ...), plus these. They differ between two runs of the same
# state, so a comparison of runs leaves them out.
MEASURED_FIELDS = ("load1", "seconds")


def is_measured(field: str) -> bool:
    """Whether a metric row's `field` measures the machine (a time, a rate, the load)."""
    return field in MEASURED_FIELDS or field.endswith("_s")


def without_measurements(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` without their machine-dependent fields (`is_measured`): what must repeat exactly
    when a run is resumed or repeated."""
    return [{k: v for k, v in r.items() if not is_measured(k)} for r in rows]


def read_metrics(workdir: str) -> list[dict[str, Any]]:
    """The rows of `<workdir>/metrics.jsonl` (empty if missing)."""
    path = os.path.join(workdir, METRICS_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class Progress:
    """tqdm bar over the ES / RL steps, showing the latest reward and held-out accuracy (+ ETA).

    Only on a terminal: redirected to a file or a pipe, stderr holds only what went wrong (a
    user's error or a stop is one line there) and the metrics are in metrics.jsonl."""

    def __init__(self, total: int, initial: int, desc: str, enabled: bool = True):
        from tqdm.auto import tqdm

        # disable=None: tqdm's "off unless stderr is a TTY".
        self._bar = tqdm(
            total=total, initial=initial, desc=desc, disable=None if enabled else True, unit="step"
        )
        self._post: dict[str, str] = {}

    def update(self, n: int = 1, **postfix: float) -> None:
        for k, v in postfix.items():
            self._post[k] = f"{v:.3f}" if isinstance(v, float) else str(v)
        self._bar.set_postfix(self._post, refresh=False)
        self._bar.update(n)

    def close(self) -> None:
        self._bar.close()
