"""`train_and_evaluate` resumes past a truncated newest checkpoint: it warns, quarantines it,
resumes the previous step and ends in exactly the state of the uninterrupted run. The run's fitness
is dense (tiny_essa_config.py): the test first asserts that the CMA-ES state moved at every
generation, the redone one included."""

import os
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from search_moved import TINY_ESSA_PER_GENERATION, assert_essa_moved

from essa_jax.checkpointing import CheckpointFallbackWarning, complete_steps
from essa_jax.config import load_config_file
from essa_jax.train import train_and_evaluate
from essa_jax.train.metrics import read_metrics, without_measurements

CONFIG = Path(__file__).resolve().parent / "tiny_essa_dense_config.py"


def _state(directory, step):
    return ocp.StandardCheckpointer().restore(os.path.join(directory, str(step), "state"))


def _train_rows(history):
    return without_measurements(r for r in history if r["phase"] == "train")


@pytest.mark.slow
def test_truncated_latest_checkpoint_resumes_previous(tmp_path):
    config = load_config_file(str(CONFIG))
    config.essa.generations = 2
    config.checkpoint.every = 1
    config.checkpoint.keep = 3
    wd = str(tmp_path / "run")
    train_and_evaluate(config, wd, verbose=False)
    d = os.path.join(wd, "checkpoints")
    assert complete_steps(d) == [0, 1, 2]
    states = [_state(d, s) for s in (0, 1, 2)]
    for g in (0, 1):
        assert_essa_moved(
            states[g], states[g + 1], **TINY_ESSA_PER_GENERATION, what=f"gen {g + 1}:"
        )
    reference = states[2]
    rows_ref = _train_rows(read_metrics(wd))

    for root, _, files in os.walk(os.path.join(d, "2", "state")):
        for f in files:
            with open(os.path.join(root, f), "r+b") as fh:
                fh.truncate(0)
    with pytest.warns(CheckpointFallbackWarning, match="step 2"):
        train_and_evaluate(config, wd, resume=True, verbose=False)

    assert complete_steps(d) == [0, 1, 2]
    assert any(n.startswith("2.corrupt-") for n in os.listdir(d))
    resumed = _state(d, 2)
    # The redone generation moved the state from the checkpoint it resumed (step 1).
    assert_essa_moved(_state(d, 1), resumed, **TINY_ESSA_PER_GENERATION, what="redone gen 2:")
    flat_ref = jax.tree_util.tree_flatten_with_path(reference)[0]
    flat_new = dict(jax.tree_util.tree_flatten_with_path(resumed)[0])
    for path, leaf in flat_ref:
        np.testing.assert_array_equal(
            np.asarray(flat_new[path]), np.asarray(leaf), err_msg=jax.tree_util.keystr(path)
        )
    # Generation 2 was redone once, with the numbers of the uninterrupted run.
    assert _train_rows(read_metrics(wd)) == rows_ref
