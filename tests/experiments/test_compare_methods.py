"""experiments/compare_methods.py (issue #32): the report's arithmetic on synthetic run records
(time to target, paired tests, aggregation over seeds, the lr sweep's choice), the plan that
--dry_run prints (tasks x methods x seeds, each command's overrides, one core per run), the
pinning of a child to its core, and the refusal to mix commits. No model runs here: the smoke
run of the script is in its issue's report."""

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))
SPEC = importlib.util.spec_from_file_location(
    "compare_methods", ROOT / "experiments" / "compare_methods.py"
)
cm = importlib.util.module_from_spec(SPEC)
sys.modules["compare_methods"] = cm
SPEC.loader.exec_module(cm)

PROBE = ROOT / "experiments" / "results" / "compare_fgrpo_probe.json"


def record(method, seed, curve, final_solved, *, task="add_2d", sft="0000", commit="c1", **kw):
    """A finished run's record as `collect` builds it (the fields the report reads)."""
    return {
        "task": task,
        "method": method,
        "seed": seed,
        "lr": kw.pop("lr", None),
        "in_table": kw.pop("in_table", True),
        "commit": commit,
        "segment_commits": [commit],
        "curve": curve,
        "sft_acc": curve[0][2],
        "final_acc": curve[-1][2],
        "sft_solved": sft,
        "final_solved": final_solved,
        "numbers_trained": kw.pop("numbers", 240),
        "peak_rss_mb": kw.pop("rss", 1000.0),
        "step_costs": kw.pop("costs", {"loop_s_per_step": 2.0}),
        "pass_at_k": {},
        "pass_correct": None,
        **kw,
    }


def test_pass_ks_and_the_hard_task_from_the_probe():
    assert cm.pass_ks(64) == (1, 2, 4, 8, 16, 32, 64)
    assert cm.pass_ks(6) == (1, 2, 4, 6) and cm.pass_ks(1) == (1,)
    probe = json.loads(PROBE.read_text())
    task, start = cm.hard_task(probe)
    assert task == "sub_2d" and start == probe["tasks"]["sub_2d"]["greedy_pass_at_1"] < 0.2
    # Not the recommendation: the qualifying candidate with the larger headroom.
    tasks = {
        "sub_2d": {"greedy_pass_at_1": 0.1, "headroom": 0.3},
        "word_problems": {"greedy_pass_at_1": 0.0, "headroom": 0.5},
        "add_2d": {"greedy_pass_at_1": 0.4, "headroom": 0.9},
    }
    assert cm.hard_task({"recommended_task": "add_2d", "tasks": tasks}) == ("word_problems", 0.0)
    tasks["word_problems"]["greedy_pass_at_1"] = tasks["sub_2d"]["greedy_pass_at_1"] = 0.25
    with pytest.raises(SystemExit, match="below 0.2"):
        cm.hard_task({"tasks": tasks})


def test_time_to_target_and_the_lr_choice():
    curve = [(0.0, 0, 0.4), (151.0, 512, 0.5), (302.0, 1024, 0.62), (455.0, 1536, 0.6)]
    assert cm.time_to_target(curve, 0.6) == 302.0
    assert cm.time_to_target(curve, 0.4) == 0.0
    assert cm.time_to_target(curve, 0.63) is None and cm.time_to_target(curve, None) is None

    def run(final, mean):  # a curve with that final accuracy and that mean
        return {"final_acc": final, "curve": [(0, 0, 2 * mean - final), (1, 1, final)]}

    sweep = {1e-6: run(0.5, 0.45), 3e-6: run(0.6, 0.5), 1e-5: run(0.6, 0.55)}
    assert cm.choose_lr(sweep) == 1e-5  # tie on the final accuracy: the higher curve mean
    sweep[3e-6] = run(0.61, 0.3)
    assert cm.choose_lr(sweep) == 3e-6  # the final accuracy first
    with pytest.raises(ValueError):
        cm.choose_lr({})


def test_paired_test_on_the_same_problems():
    # Per seed the other solves problem 1 that the reference misses; on seed 1 it also breaks 3.
    out = cm.paired([("0011", "0111"), ("0011", "0110")], resamples=2000)
    # Per problem, mean over seeds: [0, 1, 0, -0.5] -> 0.125.
    assert out["diff"] == pytest.approx(0.125)
    assert out["better"] == 2 and out["worse"] == 1 and out["seeds"] == 2
    assert out["problems"] == 4
    assert out["mcnemar_p"] == pytest.approx(1.0)  # 2 vs 1: min(1, 2 * P[X <= 1 | 3, 1/2])
    assert -0.5 <= out["ci"][0] <= 0.125 <= out["ci"][1] <= 1.0
    strong = cm.paired([("0" * 40, "1" * 20 + "0" * 20)] * 3)
    assert strong["diff"] == 0.5 and strong["ci"][0] > 0.3 and strong["mcnemar_p"] < 1e-10
    assert cm.paired([(None, "01")]) is None


def test_aggregation_over_seeds_and_time_to_target():
    full = [
        record("grpo_full", 0, [(0, 0, 0.4), (150, 64, 0.55), (300, 128, 0.5)], "1100", lr=3e-6),
        record("grpo_full", 1, [(0, 0, 0.4), (150, 64, 0.45), (300, 128, 0.6)], "1110", lr=3e-6),
    ]
    essa = [
        record("essa", 0, [(0, 0, 0.4), (160, 4096, 0.6), (310, 8192, 0.6)], "1110"),
        record("essa", 1, [(0, 0, 0.4), (140, 4096, 0.5), (320, 8192, 0.55)], "1100"),
    ]
    swept = record("grpo_full", 0, [(0, 0, 0.4), (150, 64, 0.9)], "1111", lr=1e-5, in_table=False)
    agg = cm.aggregate(
        full + essa + [swept],
        ["add_2d"],
        ["essa", "grpo_full"],
        wall=300,
        eval_seconds=150,
        resamples=500,
    )["add_2d"]
    assert agg["target"] == {"0": 0.55, "1": 0.6}  # grpo_full's best per seed (not the sweep's)
    e, f = agg["essa"], agg["grpo_full"]
    assert f["final_acc_mean"] == pytest.approx(0.55) and f["lr"] == 3e-6
    assert e["final_acc_mean"] == pytest.approx(0.575)
    assert e["final_acc_sd"] == pytest.approx(np.std([0.6, 0.55], ddof=1))
    assert (e["final_acc_min"], e["final_acc_max"]) == (0.55, 0.6)
    assert f["time_to_target"] == {"0": 150.0, "1": 300.0}
    assert e["time_to_target"] == {"0": 160.0, "1": None}  # seed 1 never reaches 0.6
    # The step-function mean: at 150 s seed 0 shows 0.4 (its 160 s eval is later), seed 1 0.5.
    # The last point: the runs' latest end (320 s), where both runs show their final accuracy.
    assert e["grid_s"] == [0.0, 150.0, 320.0] and f["grid_s"] == [0.0, 150.0, 300.0]
    assert e["mean_curve"] == pytest.approx([0.4, 0.45, 0.575])
    assert e["vs_sft"]["diff"] == pytest.approx(0.625)  # "0000" -> 3 and 2 of 4 solved
    vs = agg["essa_vs_grpo_full"]
    assert vs["seeds"] == 2 and vs["diff"] == pytest.approx(0.0)  # seed-paired: 3-2 and 2-3
    assert vs["better"] == 1 and vs["worse"] == 1


def test_report_records_commits_and_leaves_per_problem_strings_out():
    recs = [
        record("essa", 0, [(0, 0, 0.4), (150, 1, 0.5)], "1100", commit="aaa"),
        record("essa", 1, [(0, 0, 0.4), (150, 1, 0.5)], "1100", commit="bbb"),
    ]
    settings = {"wall_seconds": 150.0, "eval_seconds": 150.0}
    payload = cm.build_report(
        recs,
        tasks=["add_2d"],
        methods=["essa"],
        sweep={},
        hard={},
        settings=settings,
        resamples=100,
    )
    assert payload["commits"] == ["aaa", "bbb"] and payload["mixed_commits"]
    assert [r["commit"] for r in payload["runs"]] == ["aaa", "bbb"]
    assert "sft_solved" not in payload["runs"][0] and "final_solved" in payload["runs"][0]
    json.dumps(payload)  # the JSON file's content


def _argv(tmp_path):
    return [
        "--tasks=add_2d hard",
        "--seeds=0 1",
        f"--out={tmp_path / 'runs'}",
        f"--out_json={tmp_path / 'out.json'}",
        f"--probe_results={PROBE}",
    ]


def _args(tmp_path, *extra):
    return cm.parse([*_argv(tmp_path), *extra])


def test_the_plan_its_overrides_and_its_commands(tmp_path, capsys):
    args = _args(tmp_path)
    plan = cm.Plan(args, {})
    tasks, hard = cm.resolve_tasks(args)
    assert tasks == ["add_2d", "sub_2d"] and hard["task"] == "sub_2d"
    sweep = plan.sweep_runs()
    assert [(e["method"], e["lr"]) for e in sweep] == [
        ("grpo_full", 1e-6),
        ("grpo_full", 3e-6),
        ("grpo_full", 1e-5),
        ("grpo_full", 3e-5),
        ("grpo_lora", 3e-5),
        ("grpo_lora", 1e-4),
        ("grpo_lora", 3e-4),
        ("grpo_lora", 1e-3),
        ("grpo_lora", 3e-3),
    ]
    assert all(e["task"] == "add_2d" and e["seed"] == 0 for e in sweep)
    best = {"grpo_full": 1e-5, "grpo_lora": 3e-5}
    runs = plan.seeded_runs(tasks, best)
    assert len(runs) == 2 * 2 * 5
    assert {(e["task"], e["method"], e["seed"]) for e in runs} == {
        (t, m, s) for t in tasks for m in cm.METHODS for s in (0, 1)
    }
    for e in runs:
        ov = e["overrides"]
        assert ov["seed"] == 0 and ov["search_seed"] == e["seed"]  # one SFT start per task
        assert ov["task.name"] == e["task"] and ov["max_wall_seconds"] == 900.0
        assert ov["eval.every"] == 0 and ov["eval.every_seconds"] == 150.0
        assert ov["eval.pass_k"] == (1, 2, 4, 8, 16, 32, 64) and ov["eval.pass_k_samples"] == 64
        full = e["method"] in ("grpo_full", "fgrpo_full")
        assert (ov.get("train.params") == "full") == full
        assert (ov.get("train.sft_params") == "lora") == full
        lr = {"grpo_full": 1e-5, "fgrpo_full": 1e-5, "grpo_lora": 3e-5}.get(e["method"])
        assert ov.get("grpo.learning_rate") == lr
        cmd = cm.command("py", ov, e["workdir"], e["config"])
        assert f"--config.search_seed={e['seed']}" in cmd
        assert cmd[cmd.index("--workdir") + 1] == e["workdir"]
    # The sweep's run at the chosen lr is the seed-0 add_2d run: one workdir.
    chosen = [e["workdir"] for e in sweep if e["lr"] == 1e-5]
    assert chosen == [
        e["workdir"]
        for e in runs
        if (e["task"], e["method"], e["seed"]) == ("add_2d", "grpo_full", 0)
    ]

    assert cm.main(["--dry_run", "--jobs=2", *_argv(tmp_path)]) == 0
    out = capsys.readouterr().out
    # Before the sweep, the seeded runs are shown at its middle lrs, whose seed-0 add_2d runs are
    # sweep runs: 9 + 20 - 2 runs, alternating between the two cores.
    assert "hard task: sub_2d" in out
    assert "27 runs (9 sweep, 18 seeded), 27 to run, 2 at a time" in out
    assert out.count("taskset -c 0 ") == 14 and out.count("taskset -c 1 ") == 13


def test_every_command_is_a_valid_config_and_counts_its_numbers(tmp_path, smollm2_gguf_path):
    from compare_fgrpo import apply_overrides

    from essa_jax.config import load_config_file
    from essa_jax.train import validate_config

    args = _args(tmp_path)
    plan = cm.Plan(args, {})
    numbers = {}
    for e in plan.seeded_runs(["add_2d", "sub_2d"], {"grpo_full": 1e-6, "grpo_lora": 1e-4})[:5]:
        c = apply_overrides(load_config_file(str(ROOT / e["config"])), e["overrides"])
        validate_config(c)
        numbers[e["method"]] = cm.numbers_trained(e["config"], e["overrides"])
    # SmolLM2-135M: 30 layers, d 576, 9 x 64 query / 3 x 64 key-value heads, rank 4 on q k v o.
    assert numbers == {
        "essa": 2 * 1 * 4 * 30,  # k = ceil(0.25 * 4) = 1 value per factor: 240
        "svdgrpo": 2 * 4 * 4 * 30,
        "grpo_lora": 30 * 4 * ((576 + 576) + 2 * (576 + 192) + (576 + 576)),
        "grpo_full": 134_515_008,
        "fgrpo_full": 134_515_008,
    }


def test_a_run_is_pinned_to_its_core(tmp_path):
    probe = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    cores = sorted(os.sched_getaffinity(0))[:2]
    for core in cores:
        log_path = tmp_path / f"log{core}"
        with open(log_path, "w") as log:
            rc, rss_kb = cm.run_pinned(probe, core, log)
        assert rc == 0 and log_path.read_text().strip() == f"[{core}]"
        assert rss_kb > 1000  # an interpreter's peak resident set, in KiB
    with open(tmp_path / "fail", "w") as log:
        assert cm.run_pinned([sys.executable, "-c", "raise SystemExit(3)"], cores[0], log)[0] == 3


def test_runs_from_another_commit_are_refused(tmp_path, capsys):
    wd = tmp_path / "runs" / "add_2d" / "essa" / "seed0"
    wd.mkdir(parents=True)
    (wd / cm.RUN_RECORD).write_text(json.dumps({"commit": "0123abc", "segments": []}))
    with pytest.raises(SystemExit, match="started at commit 0123abc.*--allow_commit_mix"):
        cm.check_commits(str(tmp_path / "runs"), "4567def", allow_mix=False)
    cm.check_commits(str(tmp_path / "runs"), "0123abc", allow_mix=False)
    cm.check_commits(str(tmp_path / "runs"), "4567def", allow_mix=True)

    def runner(core):
        raise AssertionError("a refused plan must run nothing")

    with pytest.raises(SystemExit, match="0123abc"):
        cm.main(["--methods=essa", *_argv(tmp_path)], make_runner=runner)


def test_finished_runs_are_archived_and_restored(tmp_path, capsys):
    """A finished run's record goes to the archive when it finishes and comes back into a fresh
    OUT (a new session's worktree) as finished: --dry_run marks it and the plan does not re-run
    it; an unfinished run (no summary.json) is neither archived nor restored."""
    out, archive = tmp_path / "runs", tmp_path / "archive"
    done = out / "add_2d" / "essa" / "seed0"
    done.mkdir(parents=True)
    for name in cm.RECORD_FILES:
        (done / name).write_text(name)
    segment = {"commit": "0123abc", "core": 0, "seconds": 1.0, "exit": 0, "peak_rss_mb": 9.0}
    record = {"commit": "0123abc", "segments": []}
    (done / cm.RUN_RECORD).write_text(json.dumps(record))
    (done / "checkpoints").mkdir()  # not a record: stays behind
    part = out / "add_2d" / "svdgrpo" / "seed0"
    part.mkdir(parents=True)
    (part / "metrics.jsonl").write_text("{}")

    def sync():
        return cm.sync_records(str(out), str(archive), cm.RECORD_FILES, complete=cm.recorded)

    # summary.json is written, but its manager has not yet appended the run's segment (another
    # manager sharing OUT syncing now): not archived, or the archive would keep it without.
    assert sync() == []
    record["segments"].append(segment)
    (done / cm.RUN_RECORD).write_text(json.dumps(record))
    assert sync() == ["add_2d/essa/seed0"]
    kept = archive / "add_2d" / "essa" / "seed0"
    assert sorted(os.listdir(kept)) == sorted(cm.RECORD_FILES)
    assert (kept / "summary.json").read_text() == "summary.json"
    assert json.loads((kept / cm.RUN_RECORD).read_text())["segments"] == [segment]
    assert not (archive / "add_2d" / "svdgrpo").exists()
    # A run finishes once: not copied again.
    assert sync() == []

    fresh = tmp_path / "fresh"
    argv = [a for a in _argv(tmp_path) if not a.startswith("--out=")]
    argv += [f"--out={fresh}", f"--archive={archive}", "--tasks=add_2d", "--seeds=0"]
    argv += ["--methods=essa"]
    assert cm.main(["--dry_run", *argv]) == 0
    printed = capsys.readouterr().out
    assert "restored 1 finished runs" in printed
    assert (fresh / "add_2d" / "essa" / "seed0" / "summary.json").exists()
    assert "# add_2d essa seed 0 (finished) [core 0]" in printed
    assert "1 runs (0 sweep, 1 seeded), 0 to run" in printed
