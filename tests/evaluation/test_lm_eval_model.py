"""The lm-eval model class against our own generate / score functions, and lm-eval offline."""

import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from essa_jax.evaluation.lm_eval_model import EssaJaxLM  # noqa: E402
from essa_jax.lora import LoraConfig, init_lora  # noqa: E402
from essa_jax.models import (  # noqa: E402
    CharTokenizer,
    decode_completions,
    forward,
    generate,
    sequence_logprobs,
    tiny_model,
)

# Per scored token: a float32 log-softmax over a 128-word vocabulary (|logits| < ~10) computed in
# two programs (different fusion / summation order) differs by a few ulps of ~10, well below this.
TOL_PER_TOKEN = float(640 * np.finfo(np.float32).eps)
CONTEXTS = ["What is 2 + 2?", "Name a colour:", "abc", "The quick brown fox jumps over the"]


@pytest.fixture(scope="module")
def model():
    config, params = tiny_model("tiny", seed=0)
    lora = init_lora(jax.random.PRNGKey(1), config, LoraConfig(rank=4, alpha=8.0))
    # PEFT starts B at 0 (no change); a trained adapter has B != 0.
    lora = {
        t: a.replace(b=0.5 * jax.random.normal(jax.random.PRNGKey(2 + i), a.b.shape))
        for i, (t, a) in enumerate(lora.items())
    }
    return config, params, CharTokenizer(), lora


def _req(kind, args, i=0):
    return Instance(request_type=kind, doc={}, arguments=args, idx=i)


def _own_greedy(config, params, tok, lora, context, max_new):
    ids = jnp.asarray([tok.encode(context)])
    gen = generate(
        params,
        config,
        ids,
        jnp.ones_like(ids),
        jax.random.PRNGKey(0),
        max_new_tokens=max_new,
        greedy=True,
        lora=lora,
    )
    return decode_completions(tok, gen.tokens, gen.lengths, config.eos_token_ids)[0]


def _own_loglik(config, params, tok, lora, context, continuation):
    ctx, cont = tok.encode(context), tok.encode(continuation)
    ids = jnp.asarray([ctx + cont])
    lp = sequence_logprobs(params, config, ids, jnp.ones_like(ids), lora=lora)[0, -len(cont) :]
    logits = forward(params, config, ids, lora=lora)[0, len(ctx) - 1 : -1]
    return float(lp.sum()), bool((np.argmax(logits, -1) == np.asarray(cont)).all()), len(cont)


@pytest.mark.parametrize("with_lora", [False, True])
def test_generate_until_matches_our_greedy_generate(model, with_lora):
    config, params, tok, lora = model
    lora = lora if with_lora else None
    lm = EssaJaxLM(config, params, tok, lora=lora, batch_size=4)
    gk = {"until": ["\n\n"], "max_gen_toks": 12, "do_sample": False}
    got = lm.generate_until([_req("generate_until", (c, gk), i) for i, c in enumerate(CONTEXTS)])
    want = [_own_greedy(config, params, tok, lora, c, 12).split("\n\n")[0] for c in CONTEXTS]
    assert any(w for w in want)  # the random model writes something
    assert got == want


def test_sampled_requests_draw_with_their_own_key(model):
    """do_sample at T = 1: request i samples with fold_in(key(seed), i), whatever its batch."""
    config, params, tok, lora = model
    lm = EssaJaxLM(config, params, tok, lora=lora, batch_size=4, seed=5)
    gk = {"until": [], "max_gen_toks": 12, "do_sample": True, "temperature": 1.0}
    got = lm.generate_until([_req("generate_until", ("abc", gk), i) for i in range(3)])
    assert len(set(got)) > 1  # same context, different draws
    for i, text in enumerate(got):
        ids = jnp.asarray([tok.encode("abc")])
        key = jax.random.fold_in(jax.random.PRNGKey(5), i)[None]
        gen = generate(params, config, ids, jnp.ones_like(ids), key, max_new_tokens=12, lora=lora)
        assert text == decode_completions(tok, gen.tokens, gen.lengths, config.eos_token_ids)[0]


def test_adapter_changes_what_is_generated_and_scored(model):
    config, params, tok, lora = model
    base, tuned = EssaJaxLM(config, params, tok), EssaJaxLM(config, params, tok, lora=lora)
    gk = {"until": [], "max_gen_toks": 12}
    reqs = [_req("generate_until", (c, gk), i) for i, c in enumerate(CONTEXTS)]
    assert base.generate_until(reqs) != tuned.generate_until(reqs)
    ll = [_req("loglikelihood", (c, " yes")) for c in CONTEXTS]
    assert [r[0] for r in base.loglikelihood(ll)] != [r[0] for r in tuned.loglikelihood(ll)]


def test_until_cuts_at_the_first_stop_string(model):
    config, params, tok, lora = model
    lm = EssaJaxLM(config, params, tok, lora=lora, batch_size=4)
    full = lm.generate_until([_req("generate_until", ("abc", {"until": [], "max_gen_toks": 12}))])[
        0
    ]
    assert len(full) >= 4
    stop = full[2:4]
    cut = lm.generate_until(
        [_req("generate_until", ("abc", {"until": [stop], "max_gen_toks": 12}))]
    )
    assert cut == [full.split(stop)[0]] and len(cut[0]) < len(full)


@pytest.mark.parametrize("with_lora", [False, True])
def test_loglikelihood_matches_sequence_logprobs(model, with_lora):
    config, params, tok, lora = model
    lora = lora if with_lora else None
    lm = EssaJaxLM(config, params, tok, lora=lora, batch_size=4)
    pairs = [(c, " blue and green") for c in CONTEXTS] + [("2 + 2 =", " 4")]
    got = lm.loglikelihood([_req("loglikelihood", p, i) for i, p in enumerate(pairs)])
    for (lp, greedy), p in zip(got, pairs, strict=True):
        want_lp, want_greedy, n = _own_loglik(config, params, tok, lora, *p)
        assert want_lp < -1.0  # a real sum of log-probs, not a zero
        assert lp == pytest.approx(want_lp, rel=0, abs=n * TOL_PER_TOKEN)
        assert greedy == want_greedy


def test_rolling_loglikelihood_is_the_texts_total(model):
    config, params, tok, lora = model
    lm = EssaJaxLM(config, params, tok, lora=lora, max_length=16, batch_size=4)
    text = "the sea is blue and the sky is grey today"  # 41 tokens: three windows of 16
    got = lm.loglikelihood_rolling([_req("loglikelihood_rolling", (text,))])[0]
    enc = tok.encode(text)
    ids = [tok.eos_token_id] + enc  # lm-eval's prefix token, then the text
    # lm-eval's windows predict up to 16 tokens each, with the tokens before them that fit one
    # 17-token row as context: every token is scored exactly once.
    want = 0.0
    for s in range(0, len(enc), 16):
        e = min(s + 16, len(enc))
        window = jnp.asarray([ids[max(0, e + 1 - 17) : e + 1]])
        lp = sequence_logprobs(params, config, window, jnp.ones_like(window), lora=lora)[0]
        want += float(lp[-(e - s) :].sum())
    assert got == pytest.approx(want, abs=len(ids) * TOL_PER_TOKEN)


@pytest.mark.slow
def test_simple_evaluate_on_local_tasks(model, tmp_path):
    """lm-eval runs our model on local-file tasks (no hub): a generation task and a multiple-choice
    task, whose accuracy is recomputed from our own log-likelihoods."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    config, params, tok, lora = model
    rows = [
        {"q": f"{a} + {b} =", "a": str(a + b), "choices": [str(a + b), str(a - b)], "gold": 0}
        for a, b in [(1, 2), (3, 4), (5, 1), (2, 2), (7, 3), (6, 6)]
    ]
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = f"""
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {data}
        test_split: test
        doc_to_text: "{{{{q}}}}"
    """
    (tmp_path / "gen.yaml").write_text(
        textwrap.dedent(common)
        + textwrap.dedent("""
        task: toy_gen
        output_type: generate_until
        doc_to_target: "{{a}}"
        generation_kwargs: {until: ["\\n"], max_gen_toks: 12, do_sample: false}
        metric_list: [{metric: exact_match, aggregation: mean, higher_is_better: true}]
    """)
    )
    (tmp_path / "mc.yaml").write_text(
        textwrap.dedent(common)
        + textwrap.dedent("""
        task: toy_mc
        output_type: multiple_choice
        doc_to_target: gold
        doc_to_choice: "{{choices}}"
        metric_list: [{metric: acc, aggregation: mean, higher_is_better: true}]
    """)
    )
    lm = EssaJaxLM(config, params, tok, lora=lora, batch_size=4)
    out = simple_evaluate(
        model=lm,
        tasks=["toy_gen", "toy_mc"],
        task_manager=TaskManager(include_path=str(tmp_path)),
        log_samples=True,
    )
    gen_samples = out["samples"]["toy_gen"]
    assert len(gen_samples) == len(rows)
    want = [_own_greedy(config, params, tok, lora, r["q"], 12).split("\n")[0] for r in rows]
    assert [s["resps"][0][0] for s in sorted(gen_samples, key=lambda s: s["doc_id"])] == want
    scores = [
        [_own_loglik(config, params, tok, lora, r["q"], " " + c)[0] for c in r["choices"]]
        for r in rows
    ]
    acc = np.mean([int(np.argmax(s) == r["gold"]) for s, r in zip(scores, rows, strict=True)])
    assert out["results"]["toy_mc"]["acc,none"] == pytest.approx(acc)
