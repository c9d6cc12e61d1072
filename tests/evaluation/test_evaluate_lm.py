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
    assert len(err) >= 1 and words in err[-1] and err[-1].startswith("essa_jax.evaluate_lm:")
