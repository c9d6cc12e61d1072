"""Fast tests of the loop plumbing: statistics, data cursor, tokenizer, SFT masks, logging,
checkpoints, plots (no model compilation)."""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from essa_jax.checkpointing import Checkpointer
from essa_jax.models.tiny import CharTokenizer, tiny_model_config
from essa_jax.train import summary as summary_lib
from essa_jax.train.metrics import MetricsLogger, read_metrics
from essa_jax.train.rollouts import PromptSet, init_cursor, next_indices
from essa_jax.train.sft import sft_sequences
from essa_jax.train.tasks import encode_split, load_task, reference_completion


def test_data_cursor_epochs_and_resume():
    n, size = 10, 4
    cursor = init_cursor(n, seed=3)
    batches = []
    for _ in range(5):
        idx, cursor = next_indices(cursor, size)
        batches.append(idx)
    stream = np.concatenate(batches)
    # Every epoch (10 consecutive draws) is a permutation of range(n), reshuffled per epoch.
    assert sorted(stream[:10]) == list(range(n)) and sorted(stream[10:20]) == list(range(n))
    assert not np.array_equal(stream[:10], stream[10:20])
    # A cursor that went through a checkpoint (int32 arrays) continues the same stream.
    c = init_cursor(n, seed=3)
    _, c = next_indices(c, 6)
    c = {k: jnp.asarray(np.asarray(v)) for k, v in c.items()}
    np.testing.assert_array_equal(next_indices(c, 8)[0], stream[6:14])


def test_char_tokenizer_roundtrip_and_chat():
    tok = CharTokenizer()
    text = "What is 12 + 34?\n"
    assert tok.decode(tok.encode(text)) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(chat)
    assert ids[0] == tok.bos_token_id and tok.eos_token_id in ids
    assert tok.decode(ids, skip_special_tokens=False) == chat
    assert max(ids) < tiny_model_config("tiny").vocab_size


def _task(**over):
    from essa_jax.config import base_config

    cfg = base_config().task
    cfg.num_train, cfg.num_heldout, cfg.system_prompt = 6, 3, ""
    for k, v in over.items():
        cfg[k] = v
    return load_task(cfg, seed=0)


def test_encode_split_prefill_prompts_targets_and_reward():
    tok = CharTokenizer()
    task, reward = _task()
    data, dropped = encode_split(tok, task.train, task, max_prompt_tokens=64, pad_id=0, eos_id=2)
    assert dropped == 0 and len(data) == 6
    for i, ex in enumerate(task.train):
        assert data.prompts[i].startswith("<|im_start|>system\n<|im_end|>\n<|im_start|>user\n")
        assert data.prompts[i].endswith("<|im_start|>assistant\n" + ex["prefill"])
        assert data.targets[i] == tok.encode(ex["answer"]) + [2]
        ids = data.tokens[i][data.mask[i] == 1].tolist()
        assert tok.decode(ids, skip_special_tokens=False) == data.prompts[i]
    assert data.mask[:, -1].all()  # left padding: every row ends with a real token
    assert data.fields["answer"] == [ex["answer"] for ex in task.train]
    right = reward(data.prompts, [a + "<|im_end|>" for a in data.fields["answer"]], **data.fields)
    wrong = reward(data.prompts, ["1000"] * 6, **data.fields)
    assert list(right) == [1.0] * 6 and list(wrong) == [0.0] * 6


def test_encode_split_drops_long_prompts_and_pads_to_width():
    tok = CharTokenizer()
    task, _ = _task(system_prompt="x" * 40)  # every prompt: 95 characters = 95 tokens
    with pytest.raises(
        ValueError,
        match=r"max_prompt_tokens = 64 is invalid.*>= 95 keeps every one.*"
        r"every one of the 6 prompts is longer \(95 tokens\)",
    ):
        encode_split(tok, task.train, task, max_prompt_tokens=64, pad_id=0, eos_id=2)
    long = dict(task.train[0], question="What is " + "1 + " * 20 + "1?")
    data, dropped = encode_split(
        tok, [*task.train, long], task, max_prompt_tokens=100, pad_id=0, eos_id=2
    )
    assert dropped == 1 and len(data) == 6 and data.tokens.shape[1] == 95
    full, _ = encode_split(tok, task.train, task, max_prompt_tokens=200, pad_id=0, eos_id=2)
    wide = full.pad_to(full.tokens.shape[1] + 3, pad_id=0)
    assert (wide.tokens[:, :3] == 0).all() and (wide.mask[:, :3] == 0).all()
    np.testing.assert_array_equal(wide.tokens[:, 3:], full.tokens)


def test_reference_completion_formats():
    ex = {"answer": "18", "solution": "Janet sells 16 - 3 - 4 = 9 eggs, 9 * 2 = 18."}
    assert reference_completion(ex, "prefill") == "18"
    assert reference_completion(ex, "chat").endswith("\\boxed{18}.")
    assert reference_completion(ex, "chat").startswith("Janet")
    assert reference_completion({"answer": "7"}, "chat") == "The final answer is \\boxed{7}."


def test_sft_sequences_mask_only_the_answer():
    tok = CharTokenizer()
    task, _ = _task()
    data, _ = encode_split(tok, task.train, task, max_prompt_tokens=64, pad_id=0, eos_id=2)
    tokens, mask, loss_mask = sft_sequences(data, pad_id=0)
    for i in range(len(data)):
        target = tokens[i][loss_mask[i] == 1].tolist()
        assert target == tok.encode(data.fields["answer"][i]) + [2]
        prompt = tokens[i][(mask[i] == 1) & (loss_mask[i] == 0)].tolist()
        assert tok.decode(prompt, skip_special_tokens=False) == data.prompts[i]
    assert (loss_mask <= mask).all()


def test_prompt_set_take_and_repeat():
    tok = CharTokenizer()
    task, _ = _task()
    data, _ = encode_split(tok, task.train[:2], task, max_prompt_tokens=64, pad_id=0, eos_id=2)
    rep = data.repeat(3)
    a = data.fields["answer"]
    assert len(rep) == 6 and rep.fields["answer"] == [a[0]] * 3 + [a[1]] * 3
    np.testing.assert_array_equal(rep.tokens[3], data.tokens[1])
    assert isinstance(rep, PromptSet)


def test_metrics_logger_restore_drops_rows_after_checkpoint(tmp_path):
    log = MetricsLogger(str(tmp_path), tensorboard=False)
    log.start()
    for s in range(1, 5):
        log.write("train", s, wall_s=float(s), tokens=10 * s, reward=np.float32(0.5))
    kept = log.history[:2]
    log2 = MetricsLogger(str(tmp_path), tensorboard=False)
    log2.restore(kept)
    log2.write("train", 3, wall_s=3.0, tokens=30, reward=0.25)
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["reward"] == 0.25 and isinstance(rows[0]["reward"], float)


def test_tensorboard_events_written(tmp_path):
    log = MetricsLogger(str(tmp_path))
    log.start()
    log.write("train", 1, wall_s=1.0, tokens=5, reward=0.5)
    log.close()
    files = os.listdir(tmp_path / "tb")
    assert any(f.startswith("events.out.tfevents") for f in files)


def test_checkpointer_roundtrip_exact(tmp_path):
    from essa_jax.es import get_strategy

    strategy = get_strategy("cma_es", num_dims=5, population_size=4, sigma_init=0.3)
    state = strategy.init(jax.random.PRNGKey(0), jnp.zeros(5))
    pop = strategy.ask(jax.random.PRNGKey(1), state)
    state = strategy.tell(state, pop, jnp.arange(4.0))
    tree = {"es": state, "key": jax.random.PRNGKey(3), "step": jnp.int32(1)}
    ck = Checkpointer(str(tmp_path), keep=2)
    ck.save(1, tree, {"history": [{"a": 1}]})
    template = {
        "es": strategy.init(jax.random.PRNGKey(9), jnp.ones(5)),
        "key": jax.random.PRNGKey(0),
        "step": jnp.int32(0),
    }
    restored, meta = ck.restore(ck.latest_step(), template)
    ck.close()
    assert meta == {"history": [{"a": 1}]}
    for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(restored), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert type(restored["es"]) is type(state)


def test_summary_and_plots(tmp_path):
    from essa_jax.config import base_config
    from essa_jax.plot import compare, overlay, table

    cfg = base_config()
    hist = [
        {
            "phase": "eval",
            "step": 0,
            "wall_s": 0.0,
            "tokens": 0,
            "acc": 0.2,
            "ci_low": 0.1,
            "ci_high": 0.3,
        },
        {"phase": "train", "step": 1, "wall_s": 1.0, "tokens": 10, "reward": 0.3},
        {
            "phase": "eval",
            "step": 1,
            "wall_s": 1.0,
            "tokens": 10,
            "acc": 0.4,
            "ci_low": 0.3,
            "ci_high": 0.5,
        },
    ]
    ev = {"acc": 0.4, "n": 10, "ci_low": 0.3, "ci_high": 0.5, "solved": "1111000000"}
    meta = {
        "sft_eval": {**ev, "acc": 0.2, "solved": "1000000100"},
        "history": hist,
        "sft_seconds": 1.0,
        "wall_s": 1.0,
        "tokens": 10,
    }
    for name in ("essa", "grpo"):
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in hist))
        s = summary_lib.make_summary(cfg, meta, ev, {"pass_at_1": 0.5})
        summary_lib.write_summary(str(d), s, verbose=False)
        assert os.path.getsize(summary_lib.plot_run(str(d), hist)) > 0
    assert s["sft_heldout_acc"] == 0.2 and s["final_heldout_acc"] == 0.4 and s["heldout_n"] == 10
    # Paired on the same 10 problems: 3 fixed (1, 2, 3), 1 broken (7); p = 2 * 5/16.
    assert (s["paired_fixed"], s["paired_broken"]) == (3, 1)
    assert s["mcnemar_p"] == pytest.approx(0.625)
    assert "3 fixed, 1 broken" in summary_lib.format_summary(s)
    assert "pass@1" in summary_lib.format_summary(s)
    assert os.path.getsize(overlay(str(tmp_path))) > 0
    assert [r["run"] for r in table(str(tmp_path))] == ["essa", "grpo"]
    assert math.isclose(table(str(tmp_path))[0]["final_acc"], 0.4)
    # write_summary stored the method as configured ("essa" for both here): compare keys by it.
    out = compare(str(tmp_path), str(tmp_path / "cmp.json"))
    assert out["heldout_n"] == 10 and out["sft_heldout_acc"] == 0.2
    assert out["essa_heldout_acc"] == 0.4 and out["essa_pass_at_1"] == 0.5
    assert out["essa_mcnemar_p"] == pytest.approx(0.625) and out["essa_paired_fixed"] == 3
    assert json.loads((tmp_path / "cmp.json").read_text()) == out
    assert os.path.getsize(tmp_path / "cmp.png") > 0
