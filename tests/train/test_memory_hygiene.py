"""Memory hygiene for paper-scale runs (issue #16): gradient accumulation, remat, float32 masters.

Micro-batched SFT and GRPO updates must equal the whole-batch update (every GRPO aggregation),
layer remat must give the same gradients, a bfloat16 model must train a float32 LoRA (an AdamW
step of lr 1e-6 that bfloat16 masters round away), and the jitted steps must lower from
`jax.ShapeDtypeStruct` arguments (the memory planner).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from essa_jax.config import ConfigError, base_config
from essa_jax.lora import LoraConfig, init_lora
from essa_jax.lora.adapter import master_weights
from essa_jax.models import hidden_states
from essa_jax.models.tiny import tiny_model
from essa_jax.rl import FrozenPolicy, GRPOConfig, GRPOTrainer, RolloutBatch
from essa_jax.rl.config import GRPOConfigError
from essa_jax.rl.losses import AGGREGATIONS
from essa_jax.train import validate_config
from essa_jax.train.sft import make_optimizer as sft_optimizer
from essa_jax.train.sft import sft_loss_and_grad, sft_step

B, TP, N = 4, 5, 6  # rows, prompt tokens, completion tokens


def _model(dtype=jnp.float32):
    cfg, params = tiny_model("tiny", 0, dtype)
    lora = init_lora(jax.random.PRNGKey(1), cfg, LoraConfig(rank=2, alpha=4.0, targets=("q", "v")))
    # Non-zero B: both factors get gradients from the first step.
    lora = {
        t: ad.replace(b=0.1 * jax.random.normal(jax.random.PRNGKey(i), ad.b.shape))
        for i, (t, ad) in enumerate(sorted(lora.items()))
    }
    return cfg, params, jax.tree.map(lambda x: x.astype(dtype), lora)


def _sft_batch(cfg):
    T = TP + N
    tokens = jax.random.randint(jax.random.PRNGKey(3), (B, T), 3, cfg.vocab_size)
    mask = np.ones((B, T), np.int32)
    mask[1, :2] = 0
    mask[3, :4] = 0
    loss_mask = np.zeros((B, T), np.int32)
    for r, n in enumerate((6, 2, 4, 1)):  # uneven target counts per row
        loss_mask[r, T - n :] = 1
    return tokens, jnp.asarray(mask), jnp.asarray(loss_mask)


def _allclose_tree(a, b, **tol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **tol)


def _moved(new, old):
    return all(
        not np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(new), jax.tree.leaves(old), strict=True)
    )


# ----------------------------------------------------------------------------- SFT


def test_sft_micro_batches_equal_the_whole_batch():
    cfg, params, lora = _model()
    tokens, mask, loss_mask = _sft_batch(cfg)
    # Plain SGD: the update is -g, so equal updates are equal gradients (AdamW's first step,
    # ~ -lr * sign(g), would hide a wrong scale).
    opt = optax.sgd(1.0)
    copy = lambda t: jax.tree.map(jnp.array, t)  # noqa: E731 - sft_step donates its inputs
    plain, _, m0 = sft_step(copy(lora), opt.init(lora), params, cfg, opt, tokens, mask, loss_mask)
    acc, _, m1 = sft_step(
        copy(lora), opt.init(lora), params, cfg, opt, tokens, mask, loss_mask,
        micro_batch_size=2,
    )  # fmt: skip
    assert _moved(plain, lora)
    # SGD(1): each leaf's new value is lora - g. Accumulating micro-batches only reorders the sum
    # over the batch's B * T token terms, so each gradient entry may differ by the float32 bound
    # of such a sum (Higham, gamma_n <= n * eps) times the terms' size, at most the leaf's largest
    # gradient entry; the subtraction from lora adds one rounding of the leaf's size.
    eps = float(np.finfo(np.float32).eps)
    n_terms = tokens.size
    for got, want, start in zip(
        jax.tree.leaves(acc), jax.tree.leaves(plain), jax.tree.leaves(lora), strict=True
    ):
        g = np.abs(np.asarray(want) - np.asarray(start)).max()
        atol = n_terms * eps * g + 2 * eps * np.abs(np.asarray(want)).max()
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=atol)
    np.testing.assert_allclose(m1["loss"], m0["loss"], rtol=1e-6)
    np.testing.assert_allclose(m1["grad_norm"], m0["grad_norm"], rtol=1e-5)


def test_sft_remat_same_gradients_and_bad_micro_batch():
    cfg, params, lora = _model()
    tokens, mask, loss_mask = _sft_batch(cfg)
    want = jax.jit(lambda lo: sft_loss_and_grad(lo, params, cfg, tokens, mask, loss_mask))(lora)
    got = jax.jit(
        lambda lo: sft_loss_and_grad(lo, params, cfg, tokens, mask, loss_mask, remat=True)
    )(lora)
    _allclose_tree(got, want, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="micro_batch_size=3 must divide the batch size 4"):
        sft_loss_and_grad(lora, params, cfg, tokens, mask, loss_mask, micro_batch_size=3)


# ----------------------------------------------------------------------------- GRPO

_GRPO_CASES = (
    ("token_mean", "grpo", 1),
    ("seq_mean_token_mean", "cispo", 2),
    ("seq_mean_token_sum_norm", "grpo", 2),
)


def _trainer(cfg, **kw):
    gcfg = GRPOConfig(group_size=2, max_new_tokens=N, beta=0.05, learning_rate=1e-3, **kw)
    return GRPOTrainer(cfg, gcfg, reward_fn=lambda p, c: [0.0] * len(c), decode=str)


def _rollout_batch(cfg):
    tokens, mask, _ = _sft_batch(cfg)
    comp = np.zeros((B, N), np.float32)
    for r, n in enumerate((6, 3, 0, 2)):  # one rollout without tokens
        comp[r, :n] = 1
    attn = np.asarray(mask).copy()
    attn[:, TP:] = comp
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(5), 3)
    return RolloutBatch(
        tokens=tokens,
        attention_mask=jnp.asarray(attn),
        completion_mask=jnp.asarray(comp),
        advantages=jax.random.normal(k1, (B,)),
        # Off-policy old log-probs: ratios away from 1, some clipped.
        old_logp=-4.0 + 0.5 * jax.random.normal(k2, (B, N)),
        ref_logp=-4.0 + 0.5 * jax.random.normal(k3, (B, N)),
    )


# micro = 1 with token_mean: a micro-batch without completion tokens (row 2).
@pytest.mark.parametrize("agg, loss, micro", _GRPO_CASES)
def test_grpo_micro_batches_equal_the_whole_batch(agg, loss, micro):
    assert {a for a, _, _ in _GRPO_CASES} == set(AGGREGATIONS)
    cfg, params, lora = _model()
    batch = _rollout_batch(cfg)
    policy = FrozenPolicy(base=params)
    eps = dict(eps_low=1.0, eps_high=5.0) if loss == "cispo" else {}
    plain = _trainer(cfg, agg=agg, loss=loss, **eps)
    acc = _trainer(cfg, agg=agg, loss=loss, micro_batch_size=micro, **eps)
    opt_state = plain.optimizer.init(lora)
    want_p, _, want_m = plain.update_step(policy, lora, opt_state, batch)
    got_p, _, got_m = acc.update_step(policy, lora, opt_state, batch)
    assert _moved(want_p, lora)
    # The AdamW step, the loss, grad / update norms and every diagnostic equal the whole batch's.
    _allclose_tree(got_p, want_p, rtol=1e-6, atol=1e-7)
    assert set(got_m) == set(want_m)
    for k in want_m:
        np.testing.assert_allclose(got_m[k], want_m[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_grpo_remat_same_gradients_and_micro_batch_validation():
    cfg, params, lora = _model()
    batch = _rollout_batch(cfg)
    policy = FrozenPolicy(base=params)
    want = jax.jit(_trainer(cfg).loss_and_grad)(policy, lora, batch)
    got = jax.jit(_trainer(cfg, remat=True).loss_and_grad)(policy, lora, batch)
    _allclose_tree(got, want, rtol=1e-5, atol=1e-7)
    with pytest.raises(GRPOConfigError, match="micro_batch_size"):
        _trainer(cfg, micro_batch_size=3).loss_and_grad(policy, lora, batch)
    with pytest.raises(GRPOConfigError, match="micro_batch_size"):
        GRPOConfig(micro_batch_size=-1)
    with pytest.raises(GRPOConfigError, match="divisor of the 8 rollouts"):
        GRPOConfig(group_size=2, num_minibatches=2, micro_batch_size=3).check_batch(16)


def test_config_fields_and_validation():
    c = base_config()
    c.method, c.model.path = "grpo", "random:tiny"
    assert (c.model.remat, c.sft.micro_batch_size, c.grpo.micro_batch_size) == (False, 0, 0)
    c.model.remat, c.grpo.micro_batch_size = True, 8
    validate_config(c, num_devices=1)
    from essa_jax.config import grpo_config

    g = grpo_config(c)
    assert (g.remat, g.micro_batch_size) == (True, 8)
    c.grpo.num_minibatches = 2  # mini-batch 16 / 2 = 16 rollouts: 8 still divides
    validate_config(c, num_devices=1)
    c.grpo.micro_batch_size = 5
    with pytest.raises(ConfigError, match="grpo.micro_batch_size"):
        validate_config(c, num_devices=1)
    c.grpo.micro_batch_size = 0
    c.sft.micro_batch_size = 5  # sft.batch_size 16
    with pytest.raises(ConfigError, match="sft.micro_batch_size"):
        validate_config(c, num_devices=1)


# ----------------------------------------------------------------------------- float32 masters


def _changed_fraction(new, old):
    n = sum(np.size(x) for x in jax.tree.leaves(old))
    changed = sum(
        int(np.sum(np.asarray(x, np.float32) != np.asarray(y, np.float32)))
        for x, y in zip(jax.tree.leaves(new), jax.tree.leaves(old), strict=True)
    )
    return changed / n


def test_bf16_model_trains_a_float32_master_lora():
    cfg, params, lora16 = _model(jnp.bfloat16)
    tokens, mask, loss_mask = _sft_batch(cfg)
    master = master_weights(lora16)
    assert {x.dtype for x in jax.tree.leaves(master)} == {jnp.dtype(jnp.float32)}
    # The adapter casts itself to the activations' dtype: the layer stays bfloat16.
    h = hidden_states(params, cfg, tokens, attention_mask=mask, lora=master)
    assert h.dtype == jnp.bfloat16
    opt = sft_optimizer(1e-6, 0.0, 1.0)
    copy = lambda t: jax.tree.map(jnp.array, t)  # noqa: E731 - sft_step donates its inputs
    state = opt.init(master)
    assert {x.dtype for x in jax.tree.leaves(state) if x.ndim} == {jnp.dtype(jnp.float32)}
    new32, _, _ = sft_step(copy(master), state, params, cfg, opt, tokens, mask, loss_mask)
    new16, _, _ = sft_step(
        copy(lora16), opt.init(lora16), params, cfg, opt, tokens, mask, loss_mask
    )
    assert _changed_fraction(new32, master) > 0.9
    assert _changed_fraction(new16, lora16) < 0.2  # bfloat16 masters round the step away
    # GRPO: init upcasts the trainable; the update moves most entries.
    tr = GRPOTrainer(
        cfg,
        GRPOConfig(group_size=2, max_new_tokens=N, learning_rate=1e-6, weight_decay=0.0),
        reward_fn=lambda p, c: [0.0] * len(c),
        decode=str,
    )
    st = tr.init(lora16, jax.random.PRNGKey(0))
    assert {x.dtype for x in jax.tree.leaves(st.params)} == {jnp.dtype(jnp.float32)}
    new, _, _ = tr.update_step(
        FrozenPolicy(base=params), st.params, st.opt_state, _rollout_batch(cfg)
    )
    assert _changed_fraction(new, st.params) > 0.9


# ----------------------------------------------------------------------------- planner


def test_steps_lower_from_abstract_inputs():
    cfg, params, lora = _model(jnp.bfloat16)
    abstract = lambda t: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), t)  # noqa: E731
    a_params = abstract(params)
    a_lora = jax.eval_shape(master_weights, abstract(lora))
    tok = jax.ShapeDtypeStruct((B, TP + N), jnp.int32)
    # SFT.
    opt = sft_optimizer(1e-5, 0.0, 1.0)
    a_opt = jax.eval_shape(opt.init, a_lora)
    compiled = sft_step.lower(
        a_lora, a_opt, a_params, cfg, opt, tok, tok, tok, remat=True, micro_batch_size=2
    ).compile()
    assert compiled.memory_analysis() is not None
    # GRPO: update_step, score, rollout.
    tr = GRPOTrainer(
        cfg,
        GRPOConfig(group_size=2, max_new_tokens=N, beta=0.1, micro_batch_size=2, remat=True),
        reward_fn=lambda p, c: [0.0] * len(c),
        decode=str,
    )
    policy = FrozenPolicy(base=a_params)
    a_state = jax.eval_shape(tr.init, abstract(lora), jax.ShapeDtypeStruct((2,), jnp.uint32))
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
    batch = RolloutBatch(
        tokens=tok,
        attention_mask=tok,
        completion_mask=f32(B, N),
        advantages=f32(B),
        old_logp=f32(B, N),
        ref_logp=f32(B, N),
    )
    tr.update_step.lower(policy, a_state.params, a_state.opt_state, batch).compile()
    tr.score.lower(policy, a_state.params, tok, tok, with_policy=True, with_ref=True).compile()
    prompts = jax.ShapeDtypeStruct((B // 2, TP), jnp.int32)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    tr.rollout.lower(policy, a_state.params, prompts, prompts, key).compile()
