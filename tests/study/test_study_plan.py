"""Planning, scheduling and archiving of a study (essa_jax.study.spec / runner / report) on
fake runs: which runs exist, in what order they may run, what the sweep chooses."""

import json
import os
import textwrap
import threading

import pytest

from essa_jax.study import check_equal_effort, load_study, plan_study, schedule, sync_records
from essa_jax.study.report import choose, sweep_summary
from essa_jax.study.runner import check_plan
from essa_jax.study.spec import center_values, extension_runs

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "configs")
ESSA = os.path.abspath(os.path.join(CONFIGS, "essa_smollm2_arith.py"))  # rank 4
GRPO = os.path.abspath(os.path.join(CONFIGS, "grpo_smollm2_arith.py"))
STUDY = """
def get_study():
    return {
        "name": "t",
        "out": OUT,
        "seeds": (0, 1),
        "tasks": {"sub_2d": {"task.name": "sub_2d"}, "add_2d": {"task.name": "add_2d"}},
        "starts": {"conv": {"config": ESSA, "overrides": {"sft.steps": 5}}},
        "arms": {
            "essa": {
                "config": ESSA,
                "start": "conv",
                "overrides": {
                    "essa.sigma_init": 1.0,
                    "essa.population_size": 24,
                    "essa.prompts_per_candidate": 64,
                },
                "sweep": {
                    "essa.sigma_init": (0.5, 1.0, 2.0),
                    "lora.rank": (4, 8),
                    "essa.population_size,essa.prompts_per_candidate": ((24, 64), (48, 32)),
                },
            },
            "grpo": {
                "config": GRPO,
                "start": "conv",
                "sweep": {"grpo.learning_rate": (1e-6, 1e-5, 1e-4, 1e-3, 3e-3)},
            },
        },
        "sweep_runs": SWEEP_RUNS,
    }
"""


def _study(tmp_path, sweep_runs=5):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "study.py"
    out = str(tmp_path / "runs")
    path.write_text(
        textwrap.dedent(STUDY)
        .replace("OUT", repr(out))
        .replace("ESSA", repr(ESSA))
        .replace("GRPO", repr(GRPO))
        .replace("SWEEP_RUNS", str(sweep_runs))
    )
    return load_study(str(path))


def test_plan_stages_starts_and_equal_effort(tmp_path):
    study = _study(tmp_path)
    runs = plan_study(study)
    by_stage = {st: [r for r in runs if r.stage == st] for st in ("start", "sweep", "final")}
    # Sweeps undecided: no final runs yet.
    assert not by_stage["final"]
    # ESSA: center + 2 sigma + 1 rank + 1 joint = 5; GRPO: center (1e-4) + 4 = 5.
    assert check_equal_effort(study, runs) == {"essa": 5, "grpo": 5}
    # Round-robin over arms: a study cut short has both sweeps equally advanced.
    assert [r.arm for r in by_stage["sweep"]] == ["essa", "grpo"] * 5
    # The rank-8 sweep run needs a rank-8 start: two starts on the sweep task.
    starts = by_stage["start"]
    assert len(starts) == 2 and {s.task for s in starts} == {"sub_2d"}
    rank8 = next(r for r in by_stage["sweep"] if r.factor == "lora.rank")
    assert rank8.overrides["lora.rank"] == 8
    assert rank8.overrides["sft.init_from"].startswith(rank8.after[0])
    start8 = next(s for s in starts if s.workdir == rank8.after[0])
    assert start8.overrides["lora.rank"] == 8 and start8.overrides["method"] == "sft"
    joint = next(r for r in by_stage["sweep"] if "," in r.factor)
    # The arm sets the joint factor to 24 x 64: the center run.
    assert (joint.overrides["essa.population_size"], joint.value) == (48, (48, 32))
    assert joint.overrides["essa.prompts_per_candidate"] == 32
    center = next(r for r in by_stage["sweep"] if r.arm == "essa" and not r.factor)
    assert center.overrides["essa.population_size"] == 24 and center.after == (starts[0].workdir,)
    for r in by_stage["sweep"]:
        assert r.overrides["eval.read_test"] is False  # tuning never reads test
        assert r.overrides["task.num_validation"] == 200
    assert center_values(study, "essa")["essa.sigma_init"] == 1.0
    # Not set by the arm: the config file's own value (grpo_smollm2_arith.py: lr 1e-4).
    assert center_values(study, "grpo")["grpo.learning_rate"] == 1e-4
    with pytest.raises(ValueError, match="equal tuning effort"):
        check_equal_effort(_study(tmp_path, sweep_runs=6), runs)


def _finish(wd, summary=None, metrics=()):
    os.makedirs(wd, exist_ok=True)
    with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
        for row in metrics:
            f.write(json.dumps(row) + "\n")
    with open(os.path.join(wd, "summary.json"), "w") as f:
        json.dump(summary or {"final_heldout_acc": 0.0}, f)


def _sweep_record(value_acc):
    return {
        "final_heldout_acc": value_acc,
        "final_split": "validation",
        "final_validation_acc": value_acc,
        "train_cpu_seconds": 10.0,
        "train_wall_seconds": 10.0,
    }


def test_choices_decide_the_final_runs(tmp_path):
    study = _study(tmp_path)
    accs = {1e-6: 0.3, 1e-5: 0.5, 1e-4: 0.6, 1e-3: 0.55, 3e-3: 0.0}
    for r in plan_study(study):
        if r.stage == "sweep" and r.arm == "grpo":
            value = r.value if r.factor else 1e-4
            _finish(r.workdir, _sweep_record(accs[value]))
    summary = sweep_summary(study)["grpo"]
    assert summary["chosen"] == {"grpo.learning_rate": 1e-4}
    assert summary["chosen_at_edge"] == {"grpo.learning_rate": False}
    finals = [r for r in plan_study(study, {"grpo": summary["chosen"]}) if r.stage == "final"]
    assert len(finals) == 2 * 2  # two tasks x two seeds
    assert {r.overrides["grpo.learning_rate"] for r in finals} == {1e-4}
    assert all(r.overrides["eval.read_test"] is True for r in finals)
    # An unfinished sweep decides nothing.
    assert choose(study, "essa", []) is None


def test_a_factor_that_changes_the_start_is_scored_by_gain_and_held(tmp_path):
    """lora.rank needs its own SFT start: its sweep run is judged by its gain over that start
    (a better start is not a better search), and with hold_start (the default) the final runs keep
    the arm's rank, so every arm of a task starts from the identical SFT model."""
    study = _study(tmp_path)
    for r in plan_study(study):
        if r.stage == "sweep" and r.arm == "essa":
            rank8 = r.factor == "lora.rank"
            # The rank-8 run ends highest (0.62) but from a start 0.10 higher: a gain of 0.02
            # against the rank-4 center's 0.05. Sigma 0.5 is the best of its factor.
            acc = {"": 0.55, "essa.sigma_init": 0.57 if r.value == 0.5 else 0.4}.get(r.factor, 0.5)
            rec = _sweep_record(0.62 if rank8 else acc)
            rec["sft_validation_acc"] = 0.60 if rank8 else 0.50
            _finish(r.workdir, rec)
    sw = sweep_summary(study)["essa"]
    assert sw["chosen"]["essa.sigma_init"] == 0.5  # other factors: by accuracy, as before
    assert sw["chosen"]["lora.rank"] == 4
    assert sw["held"] == {"lora.rank": {"kept": 4, "sweep_best": 4}}
    assert {r["start_validation_acc"] for r in sw["runs"]} == {0.5, 0.6}
    finals = [r for r in plan_study(study, {"essa": sw["chosen"]}) if r.stage == "final"]
    assert {r.overrides.get("lora.rank", 4) for r in finals} == {4}
    # Not held: chosen on gain, so rank 4 still (0.05 > 0.02), and rank 8 once its gain leads.
    study.hold_start = False
    assert choose(study, "essa", _records(study, "essa"))["lora.rank"] == 4
    rank8 = next(r for r in plan_study(study) if r.arm == "essa" and r.factor == "lora.rank")
    rec = _sweep_record(0.70)
    rec["sft_validation_acc"] = 0.60
    _finish(rank8.workdir, rec)
    assert choose(study, "essa", _records(study, "essa"))["lora.rank"] == 8
    # An arm's "hold" list keeps a factor at the arm's value whatever the sweep found.
    study.arms["essa"]["hold"] = ("essa.sigma_init",)
    assert choose(study, "essa", _records(study, "essa"))["essa.sigma_init"] == 1.0
    assert sweep_summary(study)["essa"]["held"] == {
        "essa.sigma_init": {"kept": 1.0, "sweep_best": 0.5}
    }


def test_an_edge_choice_is_bracketed_by_an_extension(tmp_path):
    """A choice at the edge of its grid (lr 1e-6, the grid's lowest) is bracketed by "extend":
    the extension's runs come after the registered sweep (whose run names stay), count apart from
    the equal-effort number, join the choice and move the edge check to the grown grid."""
    study = _study(tmp_path)
    accs = {1e-6: 0.6, 1e-5: 0.5, 1e-4: 0.4, 1e-3: 0.3, 3e-3: 0.0, 3e-7: 0.55}
    before = {r.name: r.value for r in plan_study(study) if r.stage == "sweep"}
    for r in plan_study(study):
        if r.stage == "sweep" and r.arm == "grpo":
            _finish(r.workdir, _sweep_record(accs[r.value if r.factor else 1e-4]))
    assert sweep_summary(study)["grpo"]["chosen_at_edge"] == {"grpo.learning_rate": True}
    study.arms["grpo"]["extend"] = {"grpo.learning_rate": (3e-7,)}
    runs = plan_study(study)
    after = {r.name: r.value for r in runs if r.stage == "sweep"}
    assert {k: after[k] for k in before} == before  # recorded runs keep their names
    (ext,) = [r for r in runs if r.extension]
    assert (ext.name, ext.value, ext.arm) == ("sweep_grpo_5", 3e-7, "grpo")
    assert check_equal_effort(study, runs) == {"essa": 5, "grpo": 5}
    assert extension_runs(runs) == {"grpo": 1}
    # Unfinished extension: the arm is undecided (no finals on a half-grown grid).
    assert choose(study, "grpo", _records(study, "grpo")) is None
    _finish(ext.workdir, _sweep_record(accs[3e-7]))
    sw = sweep_summary(study)["grpo"]
    assert sw["chosen"] == {"grpo.learning_rate": 1e-6}
    assert sw["chosen_at_edge"] == {"grpo.learning_rate": False}
    assert sw["factors"]["grpo.learning_rate"][-1] == 3e-7
    assert [r["value"] for r in sw["runs"] if r["extension"]] == [3e-7]
    # An extension lies outside the grid, of a factor the arm sweeps.
    for extend, match in (
        ({"grpo.learning_rate": (5e-5,)}, "inside its grid"),
        ({"grpo.group_size": (2,)}, "extends 'grpo.group_size', which it does not sweep"),
    ):
        study.arms["grpo"]["extend"] = extend
        path = tmp_path / "ext.py"
        path.write_text(
            "def get_study():\n    return " + repr({k: v for k, v in study.items()}) + "\n"
        )
        with pytest.raises(ValueError, match=match):
            load_study(str(path))


def _records(study, arm):
    from essa_jax.study.report import sweep_records

    return sweep_records(study)[arm]


def test_no_run_starts_after_the_deadline(tmp_path):
    study = _study(tmp_path)
    runs = [r for r in plan_study(study) if r.arm in ("", "grpo")]
    started = []

    def run_one(spec, core):
        started.append(spec)
        _finish(spec.workdir)
        return 0

    assert schedule(runs, [0], run_one, log=lambda m: None, start_until=0.0) == []
    assert not started and not any(os.path.exists(r.workdir) for r in runs)


def test_schedule_respects_dependencies_and_stops_on_failure(tmp_path):
    study = _study(tmp_path)
    runs = [r for r in plan_study(study) if r.arm in ("", "grpo")]
    order, lock = [], threading.Lock()

    def run_one(spec, core):
        assert all(os.path.exists(os.path.join(w, "summary.json")) for w in spec.after)
        with lock:
            order.append((spec.stage, core))
        _finish(spec.workdir)
        return 0

    ran = schedule(runs, [0, 1], run_one, log=lambda m: None)
    assert len(ran) == len([r for r in runs]) and order[0][0] == "start"
    assert schedule(runs, [0, 1], run_one, log=lambda m: None) == []  # all finished

    study2 = _study(tmp_path / "b")
    runs2 = [r for r in plan_study(study2) if r.arm in ("", "grpo")]
    with pytest.raises(SystemExit, match="a study run failed"):
        schedule(runs2, [0], lambda s, c: 1, log=lambda m: None)


def test_sync_records_round_trip_and_plan_check(tmp_path):
    src, dst = tmp_path / "out", tmp_path / "archive"
    wd = src / "sub_2d" / "sft_conv" / "seed0"
    _finish(str(wd), metrics=[{"phase": "eval", "step": 0, "acc": 0.5}])
    (wd / "adapter").mkdir()
    (wd / "adapter" / "adapter_config.json").write_text("{}")
    (wd / "checkpoints").mkdir()  # never archived
    (src / "unfinished").mkdir()
    assert sync_records(str(src), str(dst)) == ["sub_2d/sft_conv/seed0"]
    copied = dst / "sub_2d" / "sft_conv" / "seed0"
    assert (copied / "adapter" / "adapter_config.json").exists()
    assert not (copied / "checkpoints").exists() and not (dst / "unfinished").exists()
    assert sync_records(str(src), str(dst)) == []  # a finished run is archived once
    fresh = tmp_path / "fresh"
    assert sync_records(str(dst), str(fresh)) == ["sub_2d/sft_conv/seed0"]

    study = _study(tmp_path / "c")
    spec = plan_study(study)[0]
    check_plan(spec)
    import dataclasses

    changed = dataclasses.replace(spec, overrides={**spec.overrides, "sft.steps": 6})
    with pytest.raises(SystemExit, match="started with other settings"):
        check_plan(changed)


def test_study_file_errors(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def get_study():\n    return {'name': 'x', 'tasks': {'a': {}}, "
        "'arms': {'e': {'config': 'c', 'start': 'nope'}}}\n"
    )
    with pytest.raises(ValueError, match="starts from 'nope'"):
        load_study(str(bad))
    bad.write_text("def get_study():\n    return {'name': 'x', 'budjet': 1}\n")
    with pytest.raises(ValueError, match="unknown study fields \\['budjet'\\]"):
        load_study(str(bad))
    with pytest.raises(ValueError, match="does not exist"):
        load_study(str(tmp_path / "missing.py"))
    bad.write_text(
        "def get_study():\n    return {'name': 'x', 'tasks': {'a': {}}, "
        "'arms': {'e': {'config': 'c', 'hodl': ('lr',)}}}\n"
    )
    with pytest.raises(ValueError, match="arm 'e' has unknown keys \\['hodl'\\]"):
        load_study(str(bad))
    bad.write_text(
        "def get_study():\n    return {'name': 'x', 'tasks': {'a': {}}, "
        "'arms': {'e': {'config': 'c', 'sweep': {'lr': (1, 2)}, 'hold': ('sigma',)}}}\n"
    )
    with pytest.raises(ValueError, match="holds 'sigma', which it does not sweep"):
        load_study(str(bad))


def test_report_from_records(tmp_path):
    """build_report / format_tables / plot on fake finished runs: start, two arms x two seeds;
    the numbers that come out are the ones put in."""
    from essa_jax.study.report import build_report, format_tables, plot

    path = tmp_path / "s.py"
    out = str(tmp_path / "runs")
    spec = {
        "name": "r",
        "out": out,
        "seeds": (0, 1),
        "tasks": {"sub_2d": {"task.name": "sub_2d"}},
        "starts": {"conv": {"config": ESSA}},
        "arms": {"es": {"config": ESSA, "start": "conv"}, "gr": {"config": GRPO, "start": "conv"}},
        "compare": (("es", "gr"),),
        "step_ratio_arms": ("es", "gr"),
        "scaling_results": "",
    }
    path.write_text(f"def get_study():\n    return {spec!r}\n")
    study = load_study(str(path))
    solved = {
        "start": "0011",
        ("es", 0): "0111",
        ("es", 1): "1111",
        ("gr", 0): "0011",
        ("gr", 1): "0111",
    }
    for spec in plan_study(study):
        key = "start" if spec.stage == "start" else (spec.arm, spec.seed)
        bits = solved[key]
        acc = bits.count("1") / 4
        curve = [
            {
                "phase": "eval",
                "step": 0,
                "cpu_s": 0.0,
                "rollouts": 0,
                "acc": 0.5,
                "split": "validation",
                "load1": 1.0,
            }
        ]
        if spec.stage == "final":
            curve.append(
                {
                    "phase": "eval",
                    "step": 10 if spec.arm == "es" else 40,
                    "cpu_s": 100.0,
                    "rollouts": 500,
                    "acc": 0.6,
                    "split": "validation",
                    "load1": 1.0,
                }
            )
        rows = [*curve, {"phase": "test", "step": curve[-1]["step"], "acc": acc, "solved": bits}]
        _finish(
            spec.workdir,
            {
                "final_heldout_acc": acc,
                "final_split": "test",
                "final_validation_acc": curve[-1]["acc"],
                "sft_validation_acc": 0.5,
                "train_cpu_seconds": 100.0,
                "train_wall_seconds": 101.0,
                "steps": curve[-1]["step"],
            },
            rows,
        )
    payload = build_report(study)
    agg = payload["aggregates"]["sub_2d"]
    assert agg["es"]["test_acc"] == [0.75, 1.0] and agg["gr"]["test_mean"] == 0.625
    assert payload["starts"]["sub_2d/sft_conv"]["test_acc"] == 0.5
    comp = payload["comparisons"][0]
    assert comp["difference_hierarchical"]["estimate"] == pytest.approx(0.25)
    # +0.05 and +0.10 reached at the second evaluation: 40 / 10 updates; +0.15 never.
    ratios = payload["step_ratios"]["sub_2d"]
    assert ratios["+0.1"]["step_ratio"] == pytest.approx(4.0)
    assert ratios["+0.15"]["es_updates"] is None
    assert payload["flagged_runs"] == [] and payload["unfinished"] == []
    text = format_tables(payload)
    assert "es - gr: +0.250" in text and "not reached" in text
    assert os.path.exists(plot(payload, str(tmp_path / "r.png")))
