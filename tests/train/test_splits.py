"""Validation split, SFT early stopping, a shared SFT start and the CPU-second budget (issue #41's
protocol pieces), on the tiny random model: what is read, when, and what the records say."""

import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from essa_jax.config import ConfigError, base_config
from essa_jax.data import canonical_key, check_disjoint, load_task
from essa_jax.train import pipeline, train_and_evaluate
from essa_jax.train.methods import validate_config


def test_canonical_key_and_disjoint_splits():
    a = {"expression": "27 + 45"}
    assert canonical_key(a) == canonical_key({"expression": "45 + 27"})
    assert canonical_key({"expression": "45 - 27"}) != canonical_key({"expression": "27 - 45"})
    assert canonical_key({"question": "What  is X?"}) == canonical_key({"question": "what is x?"})
    cfg = {"name": "add_2d", "num_train": 2000, "num_eval": 200, "seed": 0}
    plain = load_task(cfg)
    task = load_task({**cfg, "num_validation": 200})
    # The test set is the same with or without a validation split (comparable with older runs).
    assert [e["id"] for e in task.eval] == [e["id"] for e in plain.eval]
    check_disjoint({"test": task.eval, "validation": task.validation, "train": task.train})
    # Without the split, swapped operands leak from train into test (what #32 measured on).
    with pytest.raises(ValueError, match="share the problem"):
        check_disjoint({"test": plain.eval, "train": plain.train})
    removed = task.overlap_removed
    assert removed["train"] > 0 and len(task.train) == 2000 - removed["train"]
    assert len(task.validation) == 200 - removed["validation"]


def tiny(method, workdir_unused=None, **kw):
    c = base_config()
    c.method = method
    c.model.path = "random:tiny"
    c.task.name = "add_1d"
    c.task.num_train = 48
    c.task.num_heldout = 8
    c.task.num_validation = 8
    c.task.reward = "char_match"  # a dense score: a random model gets partial credit
    c.sft.steps = 6
    c.sft.batch_size = 4
    c.sft.learning_rate = 3e-2
    c.essa.population_size = 4
    c.essa.prompts_per_candidate = 2
    c.essa.generations = 3
    c.essa.greedy = False
    c.generation.max_new_tokens = 3
    c.eval.every = 2
    c.eval.batch_size = 8
    c.checkpoint.every = 0
    for k, v in kw.items():
        node = c
        *path, last = k.split(".")
        for p in path:
            node = node[p]
        node[last] = v
    return c


def _rows(wd):
    with open(os.path.join(wd, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    wd = str(tmp_path_factory.mktemp("sft"))
    scores = iter([0.2, 0.5, 0.4])

    c = tiny("sft", **{"sft.eval_every": 2, "sft.patience": 0})
    real = pipeline.evaluate_policy
    seen = {}

    def fake(run, lora, **kw):
        ev = real(run, lora, **kw)
        if kw.get("split") == "validation" and "step" not in kw and len(seen) < 3:
            # SFT's early-stopping evaluations: scripted scores, the adapter remembered.
            ev["acc"] = next(scores)
            seen[len(seen)] = jax_copy(lora)
        return ev

    pipeline.evaluate_policy = fake
    try:
        summary = train_and_evaluate(c, wd, verbose=False)
    finally:
        pipeline.evaluate_policy = real
    return wd, summary, seen


def jax_copy(lora):
    import jax

    return jax.tree.map(np.asarray, lora)


def test_sft_keeps_the_best_validation_adapter(sft_run):
    wd, summary, seen = sft_run
    es = summary["sft_early_stopping"]
    assert es["best_step"] == 4 and [s for s, _ in es["curve"]] == [2, 4, 6]
    # The exported adapter is the one evaluated at step 4, not the last (step 6).
    exported = load_file(os.path.join(wd, "adapter", "adapter_model.safetensors"))
    import jax

    best = jax.tree.leaves(seen[1])
    last = jax.tree.leaves(seen[2])
    assert not all(np.allclose(a, b) for a, b in zip(best, last, strict=True)), "SFT did not move"
    # PEFT stores each layer's factors apart (and transposed): compare the totals.
    total = sum(float(np.abs(v).sum()) for v in exported.values())
    assert total == pytest.approx(sum(float(np.abs(v).sum()) for v in best), rel=1e-5)
    assert total != pytest.approx(sum(float(np.abs(v).sum()) for v in last), rel=1e-5)
    rows = _rows(wd)
    assert [r["step"] for r in rows if r["phase"] == "sft_eval"] == [2, 4, 6]
    tests = [r for r in rows if r["phase"] == "test"]
    assert len(tests) == 1 and tests[0]["split"] == "test"  # the test set read once
    assert summary["final_split"] == "test"


def test_shared_start_budget_and_test_read_once(sft_run, monkeypatch):
    sft_wd, sft_summary, _ = sft_run
    wd = os.path.join(os.path.dirname(sft_wd), "essa")
    ticks = iter(range(0, 10_000, 7))  # 7 CPU seconds per call: 2 calls per step
    monkeypatch.setattr(pipeline, "cpu_clock", lambda: float(next(ticks)))
    c = tiny(
        "essa",
        **{
            "sft.init_from": os.path.join(sft_wd, "adapter"),
            "max_cpu_seconds": 10.0,
            "essa.generations": 50,
        },
    )
    s = train_and_evaluate(c, wd, verbose=False)
    assert s["steps"] == 2 and s["train_cpu_seconds"] == 14.0  # stopped at the first step past 10
    # The start is the SFT run's adapter: the same test score before the loop.
    assert s["sft_heldout_acc"] == sft_summary["final_heldout_acc"]
    assert s["sft_init_from"] == os.path.abspath(os.path.join(sft_wd, "adapter"))
    rows = _rows(wd)
    evals = [r for r in rows if r["phase"] == "eval"]
    assert {r["split"] for r in evals} == {"validation"} and all("load1" in r for r in evals)
    assert [r["phase"] for r in rows].count("test") == 1
    assert s["final_validation_acc"] == evals[-1]["acc"] and evals[-1]["step"] == 2

    wd2 = os.path.join(os.path.dirname(sft_wd), "essa_tune")
    c2 = tiny("essa", **{"sft.init_from": os.path.join(sft_wd, "adapter"), "eval.read_test": False})
    s2 = train_and_evaluate(c2, wd2, verbose=False)
    assert s2["final_split"] == "validation" and "test" not in [r["phase"] for r in _rows(wd2)]
    assert s2["final_heldout_acc"] == s2["final_validation_acc"]


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="sft.eval_every"):
        validate_config(tiny("sft", **{"task.num_validation": 0, "sft.eval_every": 2}))
    with pytest.raises(ConfigError, match="sft.init_from"):
        validate_config(tiny("essa", **{"sft.init_from": str(tmp_path)}))
    with pytest.raises(ConfigError, match="eval.read_test"):
        validate_config(tiny("essa", **{"task.num_validation": 0, "eval.read_test": False}))
    with pytest.raises(ConfigError, match="task.num_validation"):
        validate_config(tiny("essa", **{"task.num_validation": -1}))
