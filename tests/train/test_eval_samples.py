"""Every held-out evaluation appends its first `eval.samples_to_log` completions to
eval_samples.jsonl (prompt, completion, gold answer, reward, step, which evaluation)."""

import json
import os
import re

from test_pipelines import tiny_config

from essa_jax.train import train_and_evaluate
from essa_jax.train.metrics import EVAL_SAMPLES_FILE, read_metrics


def test_each_evaluation_logs_its_samples(tmp_path):
    c = tiny_config("grpo", steps=2)  # evaluations at step 2 (eval.every), also the final one
    c.task.reward = "char_match"  # graded partial credit: rewards differ between completions
    c.eval.base_model = True
    c.eval.samples_to_log = c.task.num_heldout  # all: the samples' mean reward is the eval's
    c.checkpoint.every = 0
    workdir = str(tmp_path / "run")
    train_and_evaluate(c, workdir, verbose=False)

    with open(os.path.join(workdir, EVAL_SAMPLES_FILE)) as f:
        rows = [json.loads(line) for line in f]
    # base and SFT at step 0, the periodic evaluation at step 2 (also the final one: not repeated)
    tags = [(r["step"], r["evaluation"]) for r in rows]
    n = c.task.num_heldout
    assert tags == [(0, "sft")] * n + [(0, "base")] * n + [(2, "periodic")] * n, tags
    evals = [r for r in read_metrics(workdir) if r["phase"] == "eval"]
    assert len(evals) == 2  # SFT's row at step 0, the periodic one at step 2
    for ev, tag in zip(evals, ("sft", "periodic"), strict=True):
        logged = [r for r in rows if r["evaluation"] == tag]
        mean = sum(r["reward"] for r in logged) / len(logged)
        assert abs(mean - ev["reward"]) <= 1e-6, (mean, ev["reward"])
    for r in rows:
        a, b = map(int, re.findall(r"(\d+) \+ (\d+)", r["prompt"])[-1])
        assert r["answer"] == str(a + b), r  # the gold answer of this row's own problem
        assert isinstance(r["completion"], str) and 0.0 <= r["reward"] <= 1.0


def test_zero_logs_nothing(tmp_path):
    c = tiny_config("sft")
    c.eval.samples_to_log = 0
    workdir = str(tmp_path / "run")
    train_and_evaluate(c, workdir, verbose=False)
    assert [r for r in read_metrics(workdir) if r["phase"] == "eval"]  # it did evaluate
    assert not os.path.exists(os.path.join(workdir, EVAL_SAMPLES_FILE))
