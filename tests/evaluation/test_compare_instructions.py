"""experiments/compare_instructions.py: the plan of runs, the commands and the report."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ci():
    sys.path.insert(0, str(ROOT / "experiments"))
    spec = importlib.util.spec_from_file_location(
        "compare_instructions", ROOT / "experiments" / "compare_instructions.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_plan_gives_both_methods_the_same_wall_clock_and_one_sft_start(ci):
    runs = ci.plan_runs([0, 3], 900.0)
    names = [r[3] for r in runs]
    assert names == ["sft", "essa_s0", "grpo_s0", "essa_s3", "grpo_s3"]
    for _, cfg, ov, name in runs[1:]:
        assert ov["max_wall_seconds"] == 900.0 and "seed" not in ov
        assert ov["eval.every"] == 0 and ov["eval.base_model"] is False  # the SFT run has the base
        assert ov["search_seed"] == int(name[-1])
        assert cfg == (ci.ESSA_CONFIG if name.startswith("essa") else ci.GRPO_CONFIG)
    # Every config validates with its overrides (the locked schema knows each field).
    from essa_jax.config import load_config_file
    from essa_jax.train import validate_config

    sys.path.insert(0, str(ROOT / "experiments"))
    from compare_fgrpo import apply_overrides

    for _, cfg, ov, _ in runs:
        config = apply_overrides(load_config_file(str(ROOT / cfg)), ov)
        validate_config(config)
        assert config.seed == 0 and config.task.reward == "ifeval_inst_strict"


def _fake_eval(path, strict, per):
    res = {
        f"{m},none": v
        for m, v in zip(
            ci_metrics(), (strict, strict + 0.1, strict + 0.05, strict + 0.15), strict=True
        )
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "results": {"ifeval_local": res},
                "per_instruction": {
                    "ifeval_local": {k: {"strict": v, "loose": v, "n": 4} for k, v in per.items()}
                },
            }
        )
    )


def ci_metrics():
    return (
        "prompt_level_strict_acc",
        "inst_level_strict_acc",
        "prompt_level_loose_acc",
        "inst_level_loose_acc",
    )


def test_report_averages_seeds_per_method_and_type(ci, tmp_path):
    assert ci.METRICS == ci_metrics()
    _fake_eval(tmp_path / "sft" / "base_lm_eval.json", 0.1, {"a": 0.2})
    _fake_eval(tmp_path / "sft" / "lm_eval.json", 0.2, {"a": 0.3})
    _fake_eval(tmp_path / "essa_s0" / "lm_eval.json", 0.3, {"a": 0.4, "b": 0.0})
    _fake_eval(tmp_path / "essa_s1" / "lm_eval.json", 0.5, {"a": 0.6, "b": 1.0})
    (tmp_path / "essa_s1" / "summary.json").write_text(
        json.dumps({"final_heldout_acc": 0.5, "steps": 7})
    )
    res = ci.report(str(tmp_path), [0, 1])
    m = res["methods"]
    assert set(m) == {"base", "sft", "essa"}  # grpo: nothing finished yet
    assert m["essa"]["prompt_level_strict_acc"] == pytest.approx(0.4)
    assert m["essa"]["inst_level_loose_acc"] == pytest.approx(0.55)
    assert m["essa"]["per_instruction_strict"] == pytest.approx({"a": 0.5, "b": 0.5})
    assert [r["seed"] for r in m["essa"]["runs"]] == [0, 1]
    assert m["essa"]["runs"][1]["summary"] == {"final_heldout_acc": 0.5, "steps": 7}
    assert m["base"]["prompt_level_strict_acc"] == pytest.approx(0.1)


def test_dry_run_prints_every_command(ci, capsys, monkeypatch):
    monkeypatch.setenv("SEEDS", "0")
    monkeypatch.setenv("OUT", "runs/x")
    assert ci.main(["--dry_run", "--python", "py"]) == 0
    out = capsys.readouterr().out
    assert out.count("-m essa_jax.main") == 3 and out.count("-m essa_jax.evaluate_lm") == 4
    assert "--no_adapter" in out and "--config.max_wall_seconds=1800.0" in out


def test_evaluated_runs_are_restored_from_the_archive(ci, tmp_path, monkeypatch, capsys):
    """A new session's OUT gets the archive's evaluated runs back (their record, not their
    checkpoints) and reports them; a run trained but not evaluated (no lm_eval.json) is not
    archived, so a later session re-runs it rather than finding no adapter to evaluate."""
    old, archive = tmp_path / "old", tmp_path / "archive"
    _fake_eval(old / "essa_s0" / "lm_eval.json", 0.3, {"a": 0.4})
    (old / "essa_s0" / "summary.json").write_text(json.dumps({"steps": 3}))
    (old / "grpo_s0").mkdir()
    (old / "grpo_s0" / "summary.json").write_text(json.dumps({"steps": 5}))
    copied = ci.sync_records(str(old), str(archive), ci.RECORD_FILES, done="lm_eval.json")
    assert copied == ["essa_s0"] and not (archive / "grpo_s0").exists()

    fresh = tmp_path / "fresh"
    monkeypatch.setenv("SEEDS", "0")
    monkeypatch.setenv("OUT", str(fresh))
    monkeypatch.setenv("ARCHIVE", str(archive))
    monkeypatch.setenv("RESULTS", str(tmp_path / "out.json"))
    assert ci.main(["--report_only"]) == 0
    assert "restored 1 finished runs" in capsys.readouterr().out
    assert (fresh / "essa_s0" / "summary.json").exists()
    res = json.loads((tmp_path / "out.json").read_text())
    assert res["methods"]["essa"]["runs"][0]["summary"] == {"steps": 3}
    assert "grpo" not in res["methods"]


def test_jobs_2_runs_a_seeds_essa_and_grpo_side_by_side_each_evaluated_on_its_core(
    ci, tmp_path, monkeypatch
):
    """--jobs 2: the SFT run first (every core: the others start from its adapter), then each
    seed's two runs at once, one core each, each evaluated on the core it trained on; a second
    invocation finds everything evaluated and runs nothing."""
    import threading

    events = []
    lock = threading.Lock()
    side_by_side = threading.Barrier(2, timeout=30)  # breaks unless two runs are in flight at once

    def train(wd, core):
        name = wd.rsplit("/", 1)[-1]
        if name.endswith("_s0"):
            side_by_side.wait()
        with lock:
            events.append(("run", name, core))
        (tmp_path / "out" / name / "summary.json").write_text(json.dumps({"steps": 1}))

    def fake_pinned(cmd, core, log, env=None):
        # The real pinned_runner (its run_record.json) around a fake `taskset -c core <cmd>`.
        assert cmd[1:3] == ["-m", "essa_jax.main"]
        train(cmd[cmd.index("--workdir") + 1], core)
        return 0, 1024

    def fake_serial(python):
        return lambda config_path, overrides, wd: train(wd, None)

    def fake_eval(python, wd, heldout, out_json, base=False, core=None):
        if Path(out_json).exists():  # as ensure_eval: an evaluation is done once
            return
        with lock:
            events.append(("eval", out_json.rsplit("/", 2)[-2] + ("/base" if base else ""), core))
        _fake_eval(Path(out_json), 0.25, {"a": 0.5})

    monkeypatch.setattr(sys.modules["compare_methods"], "run_pinned", fake_pinned)
    monkeypatch.setattr(ci, "subprocess_runner", fake_serial)
    monkeypatch.setattr(ci, "ensure_eval", fake_eval)
    monkeypatch.setattr(ci, "heldout_file", lambda out: "heldout.jsonl")
    monkeypatch.setattr(ci, "git_commit", lambda: "abc")
    monkeypatch.setenv("SEEDS", "0 1")
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    monkeypatch.setenv("ARCHIVE", str(tmp_path / "archive"))
    monkeypatch.setenv("RESULTS", str(tmp_path / "res.json"))
    assert ci.main(["--jobs", "2"]) == 0

    assert events[:3] == [("run", "sft", None), ("eval", "sft", None), ("eval", "sft/base", None)]
    runs = {name: core for kind, name, core in events if kind == "run"}
    evals = {name: core for kind, name, core in events if kind == "eval"}
    assert set(runs) == {"sft", "essa_s0", "grpo_s0", "essa_s1", "grpo_s1"}
    assert {runs["essa_s0"], runs["grpo_s0"]} == {0, 1}
    for name in ("essa_s0", "grpo_s0", "essa_s1", "grpo_s1"):
        assert evals[name] == runs[name]  # evaluated where it ran
        assert (tmp_path / "archive" / name / "lm_eval.json").exists()
    res = json.loads((tmp_path / "res.json").read_text())
    assert [r["pinned_cores"] for r in res["methods"]["essa"]["runs"]] == [
        [runs["essa_s0"]],
        [runs["essa_s1"]],
    ]

    n = len(events)
    assert ci.main(["--jobs", "2"]) == 0
    assert len(events) == n  # all evaluated: nothing re-run


def test_jobs_beyond_the_cores_is_refused(ci, capsys):
    import os

    with pytest.raises(SystemExit) as e:
        ci.main(["--jobs", str((os.cpu_count() or 1) + 1), "--report_only"])
    assert e.value.code == 2 and "one core per run" in capsys.readouterr().err


def test_paired_comparisons_use_each_runs_own_per_prompt_outcomes(ci, tmp_path, capsys):
    """ESSA vs SFT, GRPO vs SFT and ESSA vs GRPO pair the runs' own held-out evaluations prompt
    by prompt (first eval = the SFT start, last = the final model); a run whose lm-eval score is
    not its own final accuracy is flagged."""

    def run(name, start, final, lm_strict):
        wd = tmp_path / name
        _fake_eval(wd / "lm_eval.json", lm_strict, {"a": 0.5})
        rows = [
            {
                "phase": "eval",
                "step": 0,
                "wall_s": 0.0,
                "acc": start.count("1") / 4,
                "solved": start,
            },
            {"phase": "es", "step": 1, "wall_s": 5.0},
            {
                "phase": "eval",
                "step": 9,
                "wall_s": 60.0,
                "acc": final.count("1") / 4,
                "solved": final,
            },
        ]
        (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    run("essa_s0", "0011", "1111", 1.0)
    run("grpo_s0", "0011", "0111", 0.5)  # lm-eval disagrees with the run's 0.75
    res = ci.report(str(tmp_path), [0])
    c = res["paired_prompt_level_strict"]
    assert c["essa_vs_sft"]["diff"] == pytest.approx(0.5) and c["essa_vs_sft"]["better"] == 2
    assert c["grpo_vs_sft"]["diff"] == pytest.approx(0.25) and c["grpo_vs_sft"]["worse"] == 0
    assert c["essa_vs_grpo"]["diff"] == pytest.approx(0.25) and c["essa_vs_grpo"]["better"] == 1
    essa, grpo = res["methods"]["essa"]["runs"][0], res["methods"]["grpo"]["runs"][0]
    assert essa["lm_eval_agrees"] and not grpo["lm_eval_agrees"]
    assert essa["heldout_curve"] == [[0.0, 0.5], [60.0, 1.0]]
    assert "solved" not in json.dumps(res)  # per-prompt strings stay in the runs' records
    # SmolLM2-135M, LoRA r4 on q/k/v/o over 30 layers: ESSA searches the top singular value of
    # each factor (2 x 4 x 30); GRPO trains the factors, r (in + out) per target and layer.
    assert res["numbers_trained"] == {
        "essa": 240,
        "grpo": 30 * 4 * (2 * (576 + 576) + 2 * (576 + 192)),
    }
    ci.print_table(res)
    assert "essa_vs_grpo: +0.250" in capsys.readouterr().out
    md = ci.markdown(res)
    assert "| ESSA vs GRPO (1 seeds x 4) | +0.250 [" in md
    assert "| essa | 1.000 | 1.100 | 1.050 | 1.150 | 1.000 | " in md  # the fake's four scores


def test_an_evaluation_on_a_core_is_pinned_like_the_runs(ci, tmp_path, monkeypatch):
    """ensure_eval(core=c) goes through compare_methods.run_pinned (taskset -c c), as the runs do;
    a failed evaluation stops the plan."""
    calls = []

    def fake(cmd, core, log, env=None):
        calls.append((cmd, core))
        return 1, 0

    monkeypatch.setattr(ci, "run_pinned", fake)
    with pytest.raises(SystemExit, match="lm-eval evaluation failed"):
        ci.ensure_eval("py", str(tmp_path), "h.jsonl", str(tmp_path / "lm_eval.json"), core=1)
    ((cmd, core),) = calls
    assert core == 1 and cmd == ci.eval_command(
        "py", str(tmp_path), "h.jsonl", str(tmp_path / "lm_eval.json"), False
    )
