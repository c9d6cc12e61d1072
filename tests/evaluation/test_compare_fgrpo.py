"""experiments/compare_fgrpo.py (issue #21) on the tiny random model: the probe, the runs, the
report, resumption, and that its command lines mean the configs its in-process runner builds."""

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from absl import flags

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location(
    "compare_fgrpo", ROOT / "experiments" / "compare_fgrpo.py"
)
cf = importlib.util.module_from_spec(SPEC)
sys.modules["compare_fgrpo"] = cf  # dataclasses look their module up there
SPEC.loader.exec_module(cf)

# random:tiny + char tokenizer; a handful of problems, 4 samples (k = 1, 4), 2 GRPO steps.
TINY = [
    "model.path=random:tiny",
    "task.num_train=64",
    "task.num_heldout=8",
    "sft.steps=1",
    "sft.batch_size=4",
    "eval.batch_size=8",
    "grpo.batch_size=16",  # 2 prompts x the plan's group of 8
    "checkpoint.every=1",
]


def _argv(tmp_path, *extra):
    argv = [
        "--probe_tasks=add_2d",
        "--methods=sft grpo fgrpo",
        "--seeds=0",
        "--steps=2",
        "--eval_every=1",
        "--samples=4",
        "--problems=8",
        "--probe_problems=4",
        f"--out={tmp_path / 'runs'}",
        f"--results={tmp_path / 'compare.json'}",
        f"--probe_results={tmp_path / 'probe.json'}",
    ]
    return argv + [f"--set={s}" for s in TINY] + list(extra)


def test_plan_and_command_lines_match_the_inprocess_configs(tmp_path):
    from essa_jax import main as main_lib
    from essa_jax.config import load_config_file

    assert (
        cf.pass_ks(64) == (1, 4, 16, 64) and cf.pass_ks(4) == (1, 4) and cf.pass_ks(8) == (1, 4, 8)
    )
    plan, _ = cf.parse_plan(_argv(tmp_path, "--methods=sft grpo fgrpo fgrpo_g1 cispo"))
    runs = plan.runs("sub_2d")
    assert [label for label, _, _ in runs] == [
        f"sub_2d {m} seed 0" for m in ("sft", "grpo", "fgrpo", "fgrpo_g1", "cispo")
    ]
    for label, ov, wd in runs + plan.probe_runs():
        argv = cf.command("python", ov, wd)[2:]  # from "--config" on
        fv = flags.FlagValues()
        holders = main_lib.define_flags(fv, sys_argv=["prog", *argv])
        fv(["prog", *argv])
        from_cli = holders["config"].value
        inproc = cf.apply_overrides(load_config_file(str(ROOT / cf.BASE_CONFIG)), ov)
        assert from_cli.to_dict() == inproc.to_dict(), label
        assert from_cli.seed == 0 and from_cli.grpo.group_size == 8, label
    ov = {label: o for label, o, _ in runs}
    assert ov["sub_2d fgrpo seed 0"]["grpo.focal_gamma"] == 0.5
    assert ov["sub_2d fgrpo_g1 seed 0"]["grpo.focal_gamma"] == 1.0
    assert ov["sub_2d cispo seed 0"]["grpo.loss"] == "cispo"
    est = plan.estimate("sub_2d", probe=True)
    assert est["total"] == pytest.approx(sum(v for k, v in est.items() if k != "total"))


def test_recommend():
    c = lambda g, h: {"greedy_pass_at_1": g, "headroom": h}  # noqa: E731
    assert cf.recommend({"add_2d": c(0.4, 0.5), "sub_2d": c(0.05, 0.6)}) == "sub_2d"
    # A start that already solves most problems is out, whatever its headroom.
    assert cf.recommend({"add_2d": c(0.6, 0.38), "sub_2d": c(0.05, 0.3)}) == "sub_2d"
    assert cf.recommend({"a": c(0.2, 0.5), "b": c(0.1, 0.5)}) == "b"  # tie: the lower start
    assert cf.recommend({"a": c(0.7, 0.2), "b": c(0.8, 0.1)}) == "a"  # none low: all of them


@pytest.mark.slow  # four tiny in-process runs and a resumed one (~75 s of CPU)
def test_smoke_probe_runs_report_and_resume(tmp_path):
    assert cf.main(_argv(tmp_path), runner=cf.inprocess_runner) == 0

    probe = json.loads((tmp_path / "probe.json").read_text())
    assert probe["recommended_task"] == "add_2d"
    row = probe["tasks"]["add_2d"]
    assert row["greedy_problems"] == 4 and row["pass_problems"] == 4 and row["pass_samples"] == 4
    assert 0.0 <= row["greedy_pass_at_1"] <= 1.0 and len(row["pass_at_4_ci"]) == 2

    res = json.loads((tmp_path / "compare.json").read_text())
    assert res["task"] == "add_2d" and res["seeds"] == [0]
    for m in ("sft", "grpo", "fgrpo"):
        for k in (1, 4):
            lo, hi = res[f"{m}_pass_at_{k}_ci"]
            assert 0.0 <= lo <= res[f"{m}_pass_at_{k}"] <= hi <= 1.0
    assert res["grpo_steps"] == res["fgrpo_steps"] == 2 and res["grpo_seeds"] == [0]
    assert res["pass_problems"] == 8 and res["pass_ks"] == [1, 4]
    assert "fgrpo_minus_grpo_pass_at_4" in res and len(res["fgrpo_minus_grpo_pass_at_4_ci"]) == 2
    runs = {r["method"]: r for r in res["runs"]}
    d = runs["fgrpo"]["diagnostics"]
    assert d["step"] == [1, 2] and d["eval_step"] == [0, 1, 2]
    for key in ("all_right", "all_wrong", "entropy", "reward"):
        assert len(d[key]) == 2 and all(v is not None for v in d[key]), key
    # random:tiny never answers: every group all wrong, none all right.
    assert d["all_wrong"] == [1.0, 1.0] and d["all_right"] == [0.0, 0.0]
    assert os.path.getsize(tmp_path / "compare.png") > 0

    # Finished runs are not re-run.
    def refuse(*_):
        raise AssertionError("a finished run was started again")

    assert cf.main(_argv(tmp_path), runner=refuse) == 0
    # An interrupted run resumes (here: from its last checkpoint, after the loop).
    wd = tmp_path / "runs" / "add_2d" / "grpo" / "seed0"
    os.remove(wd / "summary.json")
    calls = []

    def count(*a):
        calls.append(a[2])
        cf.inprocess_runner(*a)

    assert cf.main(_argv(tmp_path), runner=count) == 0
    assert calls == [str(wd)] and (wd / "summary.json").exists()
    # A workdir started with other settings is refused, not silently mixed.
    os.remove(wd / "summary.json")
    with pytest.raises(SystemExit, match="other settings.*grpo.steps"):
        cf.main(_argv(tmp_path, "--steps=3"), runner=refuse)


def _fake_run(wd, method, counts, steps=30, n=64):
    """A finished run's files as essa_jax.main writes them (summary.json, metrics.jsonl)."""
    import numpy as np

    from essa_jax.evaluation import mean_pass_at_k

    os.makedirs(wd, exist_ok=True)
    summary = {
        "method": method,
        "steps": 0 if method == "sft" else steps,
        "sft_heldout_acc": 0.1,
        "final_heldout_acc": 0.2,
        "final_heldout_ci": [0.1, 0.3],
        "heldout_n": len(counts),
        "train_wall_seconds": 1.0,
        "pass_samples": n,
        "pass_problems": len(counts),
        "pass_correct": [int(c) for c in counts],
        **{f"pass_at_{k}": mean_pass_at_k(counts, n, k) for k in (1, 4, 16, 64)},
    }
    (Path(wd) / "summary.json").write_text(json.dumps(summary))
    rng = np.random.default_rng(len(method))
    rows = [{"phase": "eval", "step": 0, "acc": 0.1, "wall_s": 0, "tokens": 0}]
    for s in range(1, summary["steps"] + 1):
        right = float(rng.random() * 0.3)
        rows.append(
            {
                "phase": "train",
                "step": s,
                "reward": 0.2,
                "all_right": right,
                "all_wrong": 0.5 - right,
                "zero_variance": 0.5,
                "entropy": 1.0 - s / 100,
                "focal_weight_mean": 0.8,
            }
        )
        if s % 10 == 0:
            rows.append({"phase": "eval", "step": s, "acc": 0.1 + s / 100})
    (Path(wd) / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_report_pools_and_pairs_finished_runs(tmp_path):
    """The report from finished runs alone (no training): estimates, intervals, paired
    differences and the plot."""
    import numpy as np

    from essa_jax.evaluation import bootstrap_ci, pass_at_k_per_problem

    rng = np.random.default_rng(0)
    sft = rng.integers(0, 20, size=200)
    grpo = np.where(rng.random(200) < 0.3, 0, np.minimum(sft * 2, 64))  # sharper, loses some
    fgrpo = np.minimum(sft + 5, 64)
    out = tmp_path / "runs"
    for m, counts in (("sft", sft), ("grpo", grpo), ("fgrpo", fgrpo)):
        _fake_run(cf.workdir(str(out), "sub_2d", m, 0), m, counts)
    res = cf.report(
        str(out),
        "sub_2d",
        ["sft", "grpo", "fgrpo"],
        [0],
        results=str(tmp_path / "c.json"),
        probe_results=None,
        resamples=2000,
    )
    assert res == json.loads((tmp_path / "c.json").read_text())
    assert (
        res["grpo_steps"] == 30 and res["fgrpo_seeds"] == [0] and res["pass_ks"] == [1, 4, 16, 64]
    )
    for m, counts in (("grpo", grpo), ("fgrpo", fgrpo)):
        per = pass_at_k_per_problem(counts, 64, 64)
        assert res[f"{m}_pass_at_64"] == pytest.approx(per.mean())
    diff = pass_at_k_per_problem(fgrpo, 64, 64) - pass_at_k_per_problem(grpo, 64, 64)
    assert res["fgrpo_minus_grpo_pass_at_64"] == pytest.approx(diff.mean())
    want = bootstrap_ci(
        np.stack(
            [
                pass_at_k_per_problem(fgrpo, 64, k) - pass_at_k_per_problem(grpo, 64, k)
                for k in (1, 4, 16, 64)
            ]
        ),
        resamples=2000,
        seed=0,
    )[3]
    assert res["fgrpo_minus_grpo_pass_at_64_ci"] == pytest.approx(list(want))
    assert res["grpo_minus_sft_pass_at_64"] < 0 < res["fgrpo_minus_sft_pass_at_64"]
    runs = {r["method"]: r for r in res["runs"]}
    assert "diagnostics" not in runs["sft"] and len(runs["grpo"]["diagnostics"]["entropy"]) == 30
    assert os.path.getsize(tmp_path / "c.png") > 0
