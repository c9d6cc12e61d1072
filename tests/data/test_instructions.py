"""The generated instruction-following task and IFEval-format task files."""

import json
import re

import numpy as np
import pytest

from essa_jax.data import MalformedRowError, generate_task, load_examples, load_task
from essa_jax.data import instructions as ins


def _strip(rows):
    return [{k: v for k, v in r.items()} for r in rows]


def test_deterministic_per_seed_and_disjoint():
    a = generate_task("instructions", num_train=300, num_eval=60, seed=3)
    b = generate_task("instructions", num_train=300, num_eval=60, seed=3)
    c = generate_task("instructions", num_train=300, num_eval=60, seed=4)
    assert _strip(a[0]) == _strip(b[0]) and _strip(a[1]) == _strip(b[1])
    assert [r["prompt"] for r in a[0]] != [r["prompt"] for r in c[0]]
    train, evals = a
    assert len(train) == 300 and len(evals) == 60
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in evals}
    assert len({r["prompt"] for r in train}) == 300
    assert len({r["id"] for r in train + evals}) == 360
    # Levels: one or two instructions; the unlevelled task mixes both.
    assert {len(r["instruction_id_list"]) for r in train} == {1, 2}
    l1, _ = generate_task("instructions_l1", num_train=50, num_eval=0, seed=0)
    l2, _ = generate_task("instructions_l2", num_train=50, num_eval=0, seed=0)
    assert {len(r["instruction_id_list"]) for r in l1} == {1}
    assert {len(r["instruction_id_list"]) for r in l2} == {2}


def test_ood_heldout_shares_no_type_topic_or_verb_with_training():
    """instructions_ood: the held-out prompts use only OOD_TYPES / OOD_TOPICS / OOD_VERBS, the
    training prompts none of them (a held-out score is transfer, not a learned template)."""
    train, evals = generate_task("instructions_ood", num_train=400, num_eval=200, seed=1)
    assert len(train) == 400 and len(evals) == 200
    ood_ids = {ins.IDS[n] for n in ins.OOD_TYPES}

    def verb(r):
        return next(v for v in ins.VERBS + ins.OOD_VERBS if r["prompt"].startswith(v + " "))

    for r in evals:
        assert set(r["instruction_id_list"]) <= ood_ids, r["instruction_id_list"]
        assert r["topic"] in ins.OOD_TOPICS and verb(r) in ins.OOD_VERBS
    for r in train:
        assert not set(r["instruction_id_list"]) & ood_ids, r["instruction_id_list"]
        assert r["topic"] not in ins.OOD_TOPICS and verb(r) in ins.VERBS
    # Every held-out type, topic and verb occurs (the split is not vacuous) and levels apply.
    assert {i for r in evals for i in r["instruction_id_list"]} == ood_ids
    assert {r["topic"] for r in evals} == set(ins.OOD_TOPICS)
    assert {verb(r) for r in evals} == set(ins.OOD_VERBS)
    l1, e1 = generate_task("instructions_ood_l1", num_train=50, num_eval=50, seed=0)
    assert {len(r["instruction_id_list"]) for r in l1 + e1} == {1}
    again = generate_task("instructions_ood", num_train=400, num_eval=200, seed=1)
    assert [r["prompt"] for r in again[1]] == [r["prompt"] for r in evals]
    with pytest.raises(ValueError, match="distinct problems"):
        generate_task("instructions_ood_l1", num_train=10, num_eval=5000, seed=0)


def test_rows_are_ifeval_rows():
    train, _ = generate_task("instructions", num_train=40, num_eval=0, seed=0)
    for r in train:
        assert set(ins.IDS.values()) >= set(r["instruction_id_list"])
        assert len(r["kwargs"]) == len(r["instruction_id_list"])
        assert r["key"] == r["id"] and r["question"] == r["prompt"]
        assert r["topic"] in r["prompt"]


def test_forbidden_words_never_in_a_reference():
    texts = [" ".join(s + (t,)) for t, _, s in ins.TOPICS.values()]
    texts += list(ins.END_PHRASES) + [ins.POSTSCRIPT]
    for w in ins.FORBIDDEN:
        assert not any(re.search(rf"\b{w}\b", t, re.IGNORECASE) for t in texts), w


def test_every_reference_follows_its_instructions():
    """Each instruction set (every kind and pair) with several draws: the reference response scores
    1.0 strict under lm-eval's IFEval checkers; the same responses paired with other prompts do
    not, so the check can fail."""
    pytest.importorskip("lm_eval")
    from essa_jax.rewards import get_reward

    rng = np.random.default_rng(0)
    rows = [ins.make_example(rng, s) for s in ins.instruction_sets(None) for _ in range(3)]
    kinds = {n for s in ins.instruction_sets(None) for n in s}
    assert kinds == set(ins.IDS)
    fields = {
        "instruction_id_list": [r["instruction_id_list"] for r in rows],
        "kwargs": [r["kwargs"] for r in rows],
        "question": [r["prompt"] for r in rows],
    }
    prompts = fields["question"]
    strict = get_reward("ifeval_prompt_strict")(prompts, [r["answer"] for r in rows], **fields)
    bad = [
        (r["instruction_id_list"], r["answer"])
        for r, v in zip(rows, strict, strict=True)
        if v != 1.0
    ]
    assert not bad, bad[:3]
    shifted = [rows[(i + 7) % len(rows)]["answer"] for i in range(len(rows))]
    mismatched = get_reward("ifeval_prompt_strict")(prompts, shifted, **fields)
    assert np.mean(mismatched) < 0.8


def test_ifeval_file_loads_and_defaults_to_the_ifeval_reward(tmp_path):
    rows = [
        {
            "key": 1000 + i,
            "prompt": f"Write about topic {i}. Answer in lowercase.",
            "instruction_id_list": [
                "change_case:english_lowercase",
                "length_constraints:number_words",
            ],
            "kwargs": [{}, {"num_words": 10 + i, "relation": "less than"}],
        }
        for i in range(10)
    ]
    path = tmp_path / "ifeval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    exs, rep = load_examples(path)
    assert rep.format == "ifeval" and rep.kept == 10
    assert exs[3]["id"] == "1003" and exs[3]["answer"] == ""
    assert exs[3]["instruction_id_list"] == rows[3]["instruction_id_list"]
    # Arrow's union schema may add None-valued keys; the values given survive.
    assert exs[3]["kwargs"][1]["num_words"] == 13
    task = load_task({"train_path": str(path), "eval_fraction": 0.2, "seed": 0})
    assert task.reward == "ifeval_inst_strict" and len(task.eval) == 2
    gen = load_task({"name": "instructions_l1", "num_train": 20, "num_eval": 5})
    assert gen.reward == "ifeval_inst_strict" and gen.prompt_format == "chat"


@pytest.mark.parametrize(
    "bad, why",
    [
        ({"instruction_id_list": []}, "non-empty list"),
        ({"kwargs": [{}]}, "one dict per instruction"),
        ({"instruction_id_list": ["a", 3], "kwargs": [{}, {}]}, "non-empty list"),
    ],
)
def test_malformed_ifeval_rows_are_named(tmp_path, bad, why):
    row = {"key": 1, "prompt": "p", "instruction_id_list": ["a", "b"], "kwargs": [{}, {}]}
    row.update(bad)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([row]))
    with pytest.raises(MalformedRowError, match=why):
        load_examples(path, format="ifeval")


def test_ifeval_reward_without_lm_eval_is_a_config_error(monkeypatch):
    """A run on an IFEval reward without the lmeval extra stops in one line (ConfigError)."""
    from essa_jax.config import ConfigError, base_config
    from essa_jax.rewards import ifeval
    from essa_jax.train.tasks import load_task as run_task

    c = base_config()
    c.task.name = "instructions_l1"
    c.task.prompt_format = "chat"
    c.task.reward = "ifeval_prompt_strict"
    c.task.num_train, c.task.num_heldout = 8, 4

    def missing():
        raise ImportError("the IFEval rewards need lm-eval: pip install 'essa_jax[lmeval]'")

    monkeypatch.setattr(ifeval, "reference", missing)
    with pytest.raises(ConfigError, match=r"task.reward.*essa_jax\[lmeval\]"):
        run_task(c.task, 0)
    monkeypatch.undo()
    task, reward = run_task(c.task, 0)
    assert task.reward == "ifeval_prompt_strict" and len(task.train) == 8
