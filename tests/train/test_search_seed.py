"""`config.search_seed` seeds the training loop alone: runs that differ only there share the task
data and the SFT adapter (the seeds of an ablation cell), and -1 is exactly `config.seed`."""

import os

import pytest

from essa_jax.config import load_config_file
from essa_jax.train import train_and_evaluate
from essa_jax.train.metrics import read_metrics, without_measurements

pytestmark = pytest.mark.slow

TINY = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "distributed", "tiny_essa_config.py"
)


def _rows(workdir: str, phase: str) -> list[dict]:
    """The metric rows of one phase without the timings (which never repeat)."""
    rows = [r for r in read_metrics(workdir) if r["phase"] == phase]
    return without_measurements(rows)


def test_search_seed_keeps_the_sft_start_and_changes_the_search(tmp_path):
    runs = {}
    for name, search_seed in (("default", -1), ("same", 0), ("other", 5)):
        c = load_config_file(TINY)
        c.essa.generations = 2
        c.checkpoint.every = 0
        c.search_seed = search_seed
        runs[name] = str(tmp_path / name)
        train_and_evaluate(c, runs[name], verbose=False)

    sft = {n: _rows(w, "sft") for n, w in runs.items()}
    start = {n: [r for r in _rows(w, "eval") if r["step"] == 0] for n, w in runs.items()}
    train = {n: _rows(w, "train") for n, w in runs.items()}
    assert sft["default"] and start["default"] and len(train["default"]) == 2
    # One SFT adapter: the same SFT losses and the same held-out answers of the SFT start.
    assert sft["default"] == sft["same"] == sft["other"]
    assert start["default"] == start["same"] == start["other"]
    # search_seed = seed is the default, generation for generation.
    assert train["default"] == train["same"]
    # Another search seed samples other candidates (and other fitness prompts).
    assert train["default"] != train["other"]
