"""`eval.every_seconds`: held-out evaluations due by loop clock, not by step count, for ESSA and
the GRPO family alike; every loop row carries `rollouts` (completions generated so far). The loop's
clock is replaced by a fake one (`train.pipeline.clock`), so no test depends on real time."""

import pytest
from test_pipelines import tiny_config

from essa_jax.config import ConfigError
from essa_jax.train import pipeline, train_and_evaluate, validate_config
from essa_jax.train.metrics import read_metrics

pytestmark = pytest.mark.slow

STEP_SECONDS = 5.0  # what the fake clock says each step took


class FakeClock:
    """Advances STEP_SECONDS per reading: the loop reads it before and after each step, so every
    step takes STEP_SECONDS of loop clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += STEP_SECONDS
        return self.now


def _evals(workdir: str) -> list[dict]:
    return [r for r in read_metrics(workdir) if r["phase"] == "eval"]


def _run(method: str, every_seconds: float, tmp_path, monkeypatch) -> tuple[str, dict]:
    c = tiny_config(method, steps=6)
    c.eval.every = 0
    c.eval.every_seconds = every_seconds
    c.checkpoint.every = 0
    monkeypatch.setattr(pipeline, "clock", FakeClock())
    wd = str(tmp_path / f"{method}_{every_seconds:g}")
    return wd, train_and_evaluate(c, wd, verbose=False)


@pytest.mark.parametrize(
    ("method", "per_step"),
    [("grpo", 8), ("essa", 16)],  # GRPO: batch 8 (2 prompts x 4); ESSA: 4 members x 4 prompts
)
def test_evaluations_fall_due_by_loop_clock(method, per_step, tmp_path, monkeypatch):
    # Off: the SFT start and the final policy only.
    wd, _ = _run(method, 0.0, tmp_path, monkeypatch)
    assert [r["step"] for r in _evals(wd)] == [0, 6]
    # Every 12 s of loop clock, 5 s per step: due after step 3 (15 s) and step 6 (30 s - 15 s).
    wd, summary = _run(method, 12.0, tmp_path, monkeypatch)
    evals = _evals(wd)
    assert [r["step"] for r in evals] == [0, 3, 6]
    assert [r["wall_s"] for r in evals] == [0.0, 3 * STEP_SECONDS, 6 * STEP_SECONDS]
    assert [r["rollouts"] for r in evals] == [0, 3 * per_step, 6 * per_step]
    train = [r for r in read_metrics(wd) if r["phase"] == "train"]
    assert [r["rollouts"] for r in train] == [per_step * s for s in range(1, 7)]
    assert summary["rollouts"] == 6 * per_step
    assert summary["train_wall_seconds"] == 6 * STEP_SECONDS


def test_every_seconds_is_validated():
    c = tiny_config("grpo")
    for bad in (-1.0, float("nan"), float("inf")):
        c.eval.every_seconds = bad
        with pytest.raises(ConfigError, match="eval.every_seconds"):
            validate_config(c)
