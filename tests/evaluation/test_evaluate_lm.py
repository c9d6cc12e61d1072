"""`python -m essa_jax.evaluate_lm`: IFEval on a local file through lm-eval, and user errors."""

import json

import pytest

pytest.importorskip("lm_eval")

from essa_jax import evaluate_lm  # noqa: E402
from essa_jax.data import generate_task  # noqa: E402


def _ifeval_file(tmp_path, n=4):
    _, held = generate_task("instructions_l1", num_train=0, num_eval=n, seed=0)
    path = tmp_path / "held.jsonl"
    keep = ("key", "prompt", "instruction_id_list", "kwargs")
    path.write_text("".join(json.dumps({k: ex[k] for k in keep}) + "\n" for ex in held))
    return path, held


def test_ifeval_file_end_to_end(tmp_path):
    path, held = _ifeval_file(tmp_path)
    out = tmp_path / "res.json"
    rc = evaluate_lm.main(
        [
            "--model",
            "random:tiny",
            "--ifeval_file",
            str(path),
            "--max_gen_toks",
            "8",
            "--batch_size",
            "4",
            "--samples",
            "--output",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    metrics = res["results"]["ifeval_local"]
    assert set(metrics) >= {"prompt_level_strict_acc,none", "inst_level_loose_acc,none"}
    per = res["per_instruction"]["ifeval_local"]
    ids = sorted({i for ex in held for i in ex["instruction_id_list"]})
    assert sorted(per) == ids and sum(v["n"] for v in per.values()) == len(held)
    # The per-type table is the samples' own verdicts: recompute them with our reward.
    from essa_jax.rewards import follow_instructions

    responses = {s["doc_id"]: s["response"] for s in res["samples"]["ifeval_local"]}
    assert len(responses) == len(held)
    strict = [
        all(
            follow_instructions(
                ex["prompt"], responses[i], ex["instruction_id_list"], ex["kwargs"], loose=False
            )
        )
        for i, ex in enumerate(held)
    ]
    assert metrics["prompt_level_strict_acc,none"] == pytest.approx(sum(strict) / len(held))


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--run", "/nonexistent/run", "--tasks", "ifeval"], "no config.json"),
        (["--model", "random:tiny"], "no task"),
        (["--model", "random:tiny", "--tasks", "no_such_task_xyz"], "unknown lm-eval task"),
        (["--model", "random:tiny", "--ifeval_file", "/nonexistent.jsonl"], "no such file"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(argv, words, capsys):
    assert evaluate_lm.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and err[0].startswith("essa_jax.evaluate_lm:")


def test_a_benchmark_whose_data_is_not_here_is_one_line_pointing_to_ifeval_file(tmp_path):
    """Offline, lm-eval's own `ifeval` task needs google/IFEval from the hub: one line (it was a
    40-line traceback from datasets), before the model is loaded, naming --ifeval_file."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    env["HF_HOME"] = str(tmp_path / "hf")  # an empty cache: the data is nowhere here
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "essa_jax.evaluate_lm", "--model", "random:tiny", "--tasks",
         "ifeval", "--limit", "1"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[0].startswith("essa_jax.evaluate_lm: the data of task(s) ifeval (google/IFEval)")
    assert "not available offline" in lines[0] and "--ifeval_file FILE" in lines[0]


def _run_with_adapter(tmp_path, adapter_step, latest_step):
    """A run's workdir as `evaluate_lm --run` reads it: config.json, adapter/ recording
    `adapter_step`, and complete checkpoints up to `latest_step`."""
    from essa_jax.train.export_record import write_export_record

    run = tmp_path / "run"
    (run / "adapter").mkdir(parents=True)
    model = {"path": "random:tiny", "dtype": "auto", "tokenizer": ""}
    (run / "config.json").write_text(json.dumps({"seed": 0, "model": model}))
    write_export_record(str(run / "adapter"), adapter_step, "essa")
    for step in range(0, latest_step + 1, 2):
        (run / "checkpoints" / str(step)).mkdir(parents=True)
    return run


def test_an_adapter_older_than_the_runs_latest_checkpoint_is_refused(tmp_path, capsys):
    """A finished run resumed for more generations and stopped: adapter/ is from step 2, the
    latest checkpoint step 4. Refused in one line naming both steps and how to get a fresh
    adapter, before the model is loaded; --allow_stale_adapter accepts it."""
    run = _run_with_adapter(tmp_path, adapter_step=2, latest_step=4)
    path, _ = _ifeval_file(tmp_path)
    argv = ["--run", str(run), "--ifeval_file", str(path), "--limit", "1"]
    assert evaluate_lm.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for words in ("is from step 2", "latest checkpoint is step 4", "resume the run to its end",
                  "--allow_stale_adapter"):  # fmt: skip
        assert words in err[0], (words, err[0])
    args = evaluate_lm.parse_args([*argv, "--allow_stale_adapter"])
    evaluate_lm.check_adapter_is_latest(args, str(run / "adapter"))  # accepted
    fresh = _run_with_adapter(tmp_path / "fresh", adapter_step=4, latest_step=4)
    args = evaluate_lm.parse_args(["--run", str(fresh), "--tasks", "x"])
    evaluate_lm.check_adapter_is_latest(args, str(fresh / "adapter"))  # the latest: accepted
