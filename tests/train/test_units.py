"""Fast tests of the loop plumbing: statistics, data cursor, tokenizer, SFT masks, logging,
checkpoints, plots (no model compilation)."""

import itertools
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from essa_jax.train import summary as summary_lib
from essa_jax.train.checkpoint import Checkpointer
from essa_jax.train.metrics import MetricsLogger, read_metrics, wilson_interval
from essa_jax.train.rollouts import PromptSet, batch_indices, pass_at_k
from essa_jax.train.sft import sft_sequences
from essa_jax.train.tasks import encode_examples, render_prompt
from essa_jax.train.tiny import CharTokenizer, tiny_model_config


def test_wilson_interval_matches_reference():
    # Reference values: statsmodels proportion_confint(20, 100, method="wilson").
    lo, hi = wilson_interval(20, 100)
    assert lo == pytest.approx(0.13337, abs=1e-4)
    assert hi == pytest.approx(0.28883, abs=1e-4)
    # Wilson bounds are the roots of (c/n - x)^2 = z^2 x (1 - x) / n.
    z = 1.959964
    for c, n in [(3, 17), (50, 200), (199, 200)]:
        for x in wilson_interval(c, n):
            assert abs(c / n - x) == pytest.approx(z * math.sqrt(x * (1 - x) / n), rel=1e-9)
    assert wilson_interval(0, 10)[0] == 0.0
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0)
    assert wilson_interval(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize("n,c,k", [(8, 3, 1), (8, 3, 4), (6, 0, 2), (6, 5, 3), (5, 2, 5)])
def test_pass_at_k_equals_subset_enumeration(n, c, k):
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = np.mean([any(samples[i] for i in s) for s in subsets])
    assert pass_at_k(n, c, k) == pytest.approx(brute)


def test_batch_indices_epochs_and_resume():
    n, size = 10, 4
    stream = np.concatenate([batch_indices(3, i * size, size, n) for i in range(5)])
    # Every epoch (10 consecutive draws) is a permutation of range(n).
    assert sorted(stream[:10]) == list(range(n))
    assert sorted(stream[10:20]) == list(range(n))
    assert not np.array_equal(stream[:10], stream[10:20])
    # Resuming from any cursor continues the same stream.
    np.testing.assert_array_equal(batch_indices(3, 6, 8, n), stream[6:14])


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


def test_render_prompt_prefills_assistant_turn():
    tok = CharTokenizer()
    msgs = [
        {"role": "user", "content": "What is 1 + 2?"},
        {"role": "assistant", "content": "1 + 2 = "},
    ]
    text = render_prompt(tok, msgs)
    assert text.endswith("<|im_start|>assistant\n1 + 2 = ")
    assert render_prompt(tok, "raw") == "raw"


def _examples():
    return [
        {"prompt": [{"role": "user", "content": "Q1"}], "answer": "7"},
        {"prompt": [{"role": "user", "content": "Q22"}], "answer": "42"},
        {"prompt": [{"role": "user", "content": "x" * 200}], "answer": "1"},
    ]


def test_encode_examples_pads_left_and_drops_long_prompts():
    tok = CharTokenizer()
    data, dropped = encode_examples(tok, _examples(), max_prompt_tokens=64, pad_id=0, eos_id=2)
    assert dropped == 1 and len(data) == 2
    # Left padding: the shorter prompt starts with one pad, both end with a real token.
    assert data.mask[0, 0] == 0 and data.mask[1, 0] == 1 and data.mask[:, -1].all()
    assert data.fields["answer"] == ["7", "42"]
    assert data.targets[1] == tok.encode("42") + [2]


def test_sft_sequences_mask_only_the_answer():
    tok = CharTokenizer()
    data, _ = encode_examples(tok, _examples()[:2], max_prompt_tokens=64, pad_id=0, eos_id=2)
    tokens, mask, loss_mask = sft_sequences(data, pad_id=0)
    for i, ans in enumerate(["7", "42"]):
        target = tokens[i][loss_mask[i] == 1].tolist()
        assert target == tok.encode(ans) + [2]
        prompt = tokens[i][(mask[i] == 1) & (loss_mask[i] == 0)].tolist()
        assert tok.decode(prompt, skip_special_tokens=False) == data.prompts[i]
    assert (loss_mask <= mask).all()


def test_prompt_set_take_and_repeat():
    tok = CharTokenizer()
    data, _ = encode_examples(tok, _examples()[:2], max_prompt_tokens=64, pad_id=0, eos_id=2)
    rep = data.repeat(3)
    assert len(rep) == 6 and rep.fields["answer"] == ["7"] * 3 + ["42"] * 3
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
    from essa_jax.plot import overlay, table

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
    ev = {"acc": 0.4, "n": 10, "ci_low": 0.3, "ci_high": 0.5}
    meta = {
        "sft_eval": {**ev, "acc": 0.2},
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
    assert "pass@1" in summary_lib.format_summary(s)
    assert os.path.getsize(overlay(str(tmp_path))) > 0
    assert [r["run"] for r in table(str(tmp_path))] == ["essa", "grpo"]
    assert math.isclose(table(str(tmp_path))[0]["final_acc"], 0.4)
