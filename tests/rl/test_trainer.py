"""The GRPO-family trainer step on a tiny random model (essa_jax.models + essa_jax.lora)."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from search_moved import lora_movement
from toy_model import TOY_CONFIG as CONFIG

from essa_jax.lora import (
    LoraConfig,
    SVDLoRA,
    genome_policy,
    genome_to_svd_lora,
    init_lora,
    lora_policy,
    sft_genome,
    svd_factorize,
    svd_policy,
)
from essa_jax.models import init_params, sequence_logprobs
from essa_jax.rl import (
    FrozenPolicy,
    GRPOConfig,
    GRPOConfigError,
    GRPOTrainer,
    group_advantages,
    register_weighting,
)

TARGET = 5  # the token the toy reward asks for


def decode(ids):
    return " ".join(str(i) for i in ids)


def contains_target(prompts, completions, **fields):
    assert len(prompts) == len(completions) == len(fields["answer"])
    return [float(str(TARGET) in c.split()) for c in completions]


@pytest.fixture(scope="module")
def model():
    return jax.jit(init_params, static_argnums=1)(jax.random.key(0), CONFIG)


def _prompts(num=4, length=3, seed=1):
    toks = jax.random.randint(jax.random.key(seed), (num, length), 3, CONFIG.vocab_size)
    return toks.astype(jnp.int32), jnp.ones((num, length), jnp.int32), [f"p{i}" for i in range(num)]


def _lora(seed=0, random_b=False, targets=("q", "k", "v", "o")):
    lora = init_lora(jax.random.key(seed), CONFIG, LoraConfig(rank=2, alpha=4.0, targets=targets))
    if random_b:  # an "SFT" adapter: B != 0, so the adapted model differs from the base
        lora = {
            t: ad.replace(b=0.3 * jax.random.normal(jax.random.key(i), ad.b.shape))
            for i, (t, ad) in enumerate(lora.items())
        }
    return lora


def _trainer(cfg, to_lora):
    return GRPOTrainer(CONFIG, cfg, to_lora=to_lora, reward_fn=contains_target, decode=decode)


def _run(trainer, state, policy, steps, num_prompts=4):
    toks, mask, texts = _prompts(num_prompts)
    history = []
    for _ in range(steps):
        state, m = trainer.step(state, policy, toks, mask, texts, answer=texts)
        history.append(m)
    return state, history


@pytest.fixture(scope="module")
def lora_setup(model):
    """One compiled trainer shared by the LoRA tests (compilation dominates their cost):
    focal (gamma 0.5), KL to the base (beta > 0), two mini-batches, temperature != 1."""
    cfg = GRPOConfig(
        group_size=4,
        max_new_tokens=4,
        learning_rate=1e-2,
        weighting="focal",
        gamma=0.5,
        beta=0.05,
        num_minibatches=2,
        temperature=0.8,
    )
    trainable, frozen, to_lora = lora_policy(_lora(random_b=True))
    trainer = _trainer(cfg, to_lora)
    return trainer, trainable, FrozenPolicy(model, frozen)


def test_steps_compile_each_program_once(model):
    """The state a step returns enters the next step's programs with the shardings the first
    step's came with (`mesh.on_mesh`), so the programs compile once, not again at step 2: the
    plain arrays of `init` and of the base (SingleDeviceSharding) against the programs' outputs
    (the mesh's NamedSharding) once cost a second compile of every program (~10 s per program
    on SmolLM2)."""
    cfg = GRPOConfig(group_size=4, max_new_tokens=4, learning_rate=1e-2, num_minibatches=2)
    trainable, frozen, to_lora = lora_policy(_lora(random_b=True))
    trainer = _trainer(cfg, to_lora)
    state = trainer.init(trainable, jax.random.key(0))
    new, _ = _run(trainer, state, FrozenPolicy(model, frozen), 3)
    assert int(new.step) == 3
    moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), new.params, state.params)
    assert max(jax.tree.leaves(moved)) > 0
    for name in ("rollout", "score", "update_step", "take"):
        fn = getattr(trainer, name)
        assert fn._cache_size() == 1, (name, fn._cache_size())


def test_step_metrics_and_state(lora_setup):
    trainer, trainable, policy = lora_setup
    state = trainer.init(trainable, jax.random.key(0))
    new, hist = _run(trainer, state, policy, 1)
    m = hist[0]
    for k in (
        "reward_mean",
        "reward_std",
        "zero_variance_frac",
        "focal_weight_mean",
        "clip_low_frac",
        "clip_high_frac",
        "kl",
        "entropy",
        "completion_len_mean",
        "truncation_rate",
        "grad_norm",
        "update_norm",
        "tokens_per_s",
        "rollout_s",
        "update_s",
        "loss",
        "ratio_mean",
    ):
        assert k in m and np.isfinite(m[k]), k
    assert int(new.step) == 1
    assert 0 < m["focal_weight_mean"] <= 1
    assert 0 < m["completion_len_mean"] <= 4
    assert m["grad_norm"] > 0 and m["update_norm"] > 0 and m["kl"] > 0
    # Two mini-batches: the second update is off-policy, so ratios move away from 1.
    assert m["ratio_max"] > 1.0 + 1e-4 or m["ratio_min"] < 1.0 - 1e-4
    moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), new.params, state.params)
    assert max(jax.tree.leaves(moved)) > 0


def test_step_is_deterministic_from_state(lora_setup):
    """Checkpoint / resume: the same state gives bit-identical next states."""
    trainer, trainable, policy = lora_setup
    state = trainer.init(trainable, jax.random.key(3))
    a, ma = _run(trainer, state, policy, 2)
    b, mb = _run(trainer, jax.tree.map(jnp.copy, state), policy, 2)
    # First: the two steps moved the LoRA (observed L2 0.71; equal states that never moved would
    # prove nothing), then: bit-identical.
    moved = lora_movement(state.params, a.params)
    assert moved > 0.1, moved
    chex.assert_trees_all_equal(a, b)
    assert ma[-1]["reward_mean"] == mb[-1]["reward_mean"]
    assert ma[-1]["loss"] == mb[-1]["loss"]


def test_old_logprobs_reference_and_generation_consistency(lora_setup, model):
    trainer, trainable, policy = lora_setup
    toks, mask, _ = _prompts()
    gen = trainer.rollout(policy, trainable, toks, mask, jax.random.key(2))
    rewards = jnp.asarray(np.random.default_rng(0).integers(0, 2, 16), jnp.float32)
    batch, _ = trainer.make_batch(policy, trainable, toks, mask, gen, rewards)
    # The sampler's log-probs (KV-cache decode, temperature 0.8) agree with the teacher-forced
    # recomputation to float rounding; the recomputed ones are what the trainer uses.
    m = np.asarray(gen.mask, bool)
    np.testing.assert_allclose(
        np.asarray(batch.old_logp)[m], np.asarray(gen.logprobs)[m], atol=2e-5
    )
    loss, aux = trainer.loss(policy, trainable, batch)
    np.testing.assert_allclose([aux["ratio_min"], aux["ratio_max"]], 1.0, atol=1e-5)
    # Reference = the base model with the adapter disabled.
    base_lp = sequence_logprobs(model, CONFIG, batch.tokens, batch.attention_mask, temperature=0.8)[
        :, -4:
    ]
    np.testing.assert_allclose(batch.ref_logp, base_lp, atol=1e-5)
    assert float(aux["kl"]) > 1e-4  # the adapter changed the policy
    # token-mean: loss = pg_loss + beta * KL.
    # The loss adds beta times the token mean of k3 (>= 0 per token) to pg_loss; aux's kl is the
    # same mean summed by another reduction: they differ by at most n * eps * kl for n tokens
    # (Higham's gamma_n), plus the rounding of the addition. Absolute: the group-normalised
    # pg_loss may be ~0.
    n = batch.completion_mask.size
    eps = float(np.finfo(np.float32).eps)
    terms = abs(float(aux["pg_loss"])) + 0.05 * float(aux["kl"])
    np.testing.assert_allclose(
        loss, aux["pg_loss"] + 0.05 * aux["kl"], rtol=0, atol=(n + 2) * eps * terms
    )


def test_svd_grpo_changes_only_singular_values(model):
    basis, layout = svd_factorize(_lora(random_b=True))
    svd = genome_to_svd_lora(basis, layout, sft_genome(layout))
    cfg = GRPOConfig(group_size=4, max_new_tokens=4, learning_rate=1e-2)
    trainable, frozen, to_lora = svd_policy(svd)
    trainer = _trainer(cfg, to_lora)
    state = trainer.init(trainable, jax.random.key(0))
    new, _ = _run(trainer, state, FrozenPolicy(model, frozen), 1)
    before, after = to_lora(state.params, frozen), to_lora(new.params, frozen)
    for t in svd:
        assert isinstance(after[t], SVDLoRA)
        for f in ("v_a", "m", "u_b"):
            np.testing.assert_array_equal(getattr(after[t], f), getattr(before[t], f))
    ds = [float(jnp.max(jnp.abs(after[t].s_a - before[t].s_a))) for t in svd]
    ds += [float(jnp.max(jnp.abs(after[t].s_b - before[t].s_b))) for t in svd]
    assert max(ds) > 1e-4
    assert set(jax.tree.leaves(jax.tree.map(jnp.shape, new.params))) <= {2, layout.rank}


def test_genome_policy_step(model):
    basis, layout = svd_factorize(_lora(random_b=True))
    cfg = GRPOConfig(group_size=4, max_new_tokens=4, learning_rate=1e-2)
    trainable, frozen, to_lora = genome_policy(basis, layout, sft_genome(layout))
    trainer = _trainer(cfg, to_lora)
    state = trainer.init(trainable, jax.random.key(0))
    new, _ = _run(trainer, state, FrozenPolicy(model, frozen), 1)
    assert new.params.shape == (layout.size,)
    assert float(jnp.max(jnp.abs(new.params))) > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_policy_learns_toy_reward(model, gamma):
    """GRPO and F-GRPO: reward = the target token appears in a 4-token completion; it must rise
    from ~0.25 (chance) to ~1 within 20 steps (observed: ~1.0 after ~10 steps)."""
    # Tied embeddings at init std 0.02 cap every logit near 0.6, so no adapter can make the target
    # likely; a larger embedding scale gives the output layer room (the rest is rms-normed).
    params = {**model, "embed": model["embed"] * 8.0}
    cfg = GRPOConfig(
        group_size=8,
        max_new_tokens=4,
        learning_rate=3e-2,
        weighting="focal" if gamma else "none",
        gamma=gamma,
    )
    trainable, frozen, to_lora = lora_policy(_lora(targets=("q", "v", "o", "up", "down")))
    trainer = _trainer(cfg, to_lora)
    state = trainer.init(trainable, jax.random.key(0))
    _, hist = _run(trainer, state, FrozenPolicy(params, frozen), 20)
    r = np.array([m["reward_mean"] for m in hist])
    assert r[:3].mean() < 0.45, r
    assert r[-5:].mean() > 0.85, r


def test_config_validation():
    with pytest.raises(GRPOConfigError, match="loss must be one of") as e:
        GRPOConfig(loss="ppo")
    assert e.value.field == "loss" and e.value.value == "ppo"
    with pytest.raises(GRPOConfigError, match="group_size") as e:
        GRPOConfig(group_size=1)
    assert e.value.field == "group_size"
    with pytest.raises(ValueError, match="agg must be one of"):
        GRPOConfig(agg="sum")
    with pytest.raises(ValueError, match="num_minibatches"):
        GRPOConfig(group_size=4, num_minibatches=3).check_batch(8)
    # DAPO is the "grpo" loss with clip-higher; CISPO's eps_low = 1 needs the "cispo" loss.
    assert GRPOConfig(eps_high=0.28).eps_high == 0.28
    with pytest.raises(GRPOConfigError, match="eps_low") as e:
        GRPOConfig(eps_low=1.0)
    assert e.value.field == "eps_low"
    c = GRPOConfig(loss="cispo", eps_low=1.0, eps_high=5.0, weighting="focal", gamma=0.5)
    assert (c.loss, c.eps_low, c.eps_high, c.gamma) == ("cispo", 1.0, 5.0, 0.5)
    assert dataclasses.replace(c, gamma=0.0).gamma == 0.0
    # Names are checked against the registries; gamma acts only with the focal weighting.
    with pytest.raises(GRPOConfigError, match="advantage must be one of") as e:
        GRPOConfig(advantage="std")
    assert e.value.field == "advantage"
    with pytest.raises(GRPOConfigError, match="weighting must be one of"):
        GRPOConfig(weighting="hard")
    with pytest.raises(GRPOConfigError, match="weighting='focal'") as e:
        GRPOConfig(gamma=0.5)
    assert e.value.field == "gamma"
    for field, value in (("top_p", 0.0), ("top_k", -1), ("epochs", 0), ("adam_b2", 1.0)):
        with pytest.raises(GRPOConfigError) as e:
            GRPOConfig(**{field: value})
        assert e.value.field == field
    hash(GRPOConfig())  # a jit static argument


def _scaled_by_prompt(rewards, group_size, cfg):
    """A custom weighting for the tests: prompt p's group gets weight p + 1 (1, 2, 3, 4)."""
    del cfg
    return jnp.repeat(jnp.arange(1.0, rewards.shape[0] // group_size + 1.0), group_size)


register_weighting("test_scaled_by_prompt", _scaled_by_prompt, overwrite=True)
register_weighting(
    "test_zero", lambda r, n, cfg: jnp.zeros(r.shape[0], jnp.float32), overwrite=True
)


def test_registered_weighting_reaches_the_batch(lora_setup):
    """A weighting registered by name is what the trainer multiplies the advantages by."""
    trainer, trainable, policy = lora_setup
    toks, mask, _ = _prompts()
    gen = trainer.rollout(policy, trainable, toks, mask, jax.random.key(2))
    rewards = jnp.array([1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0], jnp.float32)
    cfg = GRPOConfig(group_size=4, max_new_tokens=4, weighting="test_scaled_by_prompt")
    custom = _trainer(cfg, trainer.to_lora)
    batch, extra = custom.make_batch(policy, trainable, toks, mask, gen, rewards)
    plain = np.asarray(group_advantages(rewards, 4))
    want = np.repeat([1.0, 2.0, 3.0, 4.0], 4) * plain
    np.testing.assert_allclose(batch.advantages, want, rtol=1e-6)
    # Hand-computed: group 0 has one success of 4, A = (1 - 1/4) / std_ddof1 = 0.75 / 0.5 = 1.5.
    np.testing.assert_allclose(batch.advantages[0], 1.0 * 1.5, rtol=1e-5)
    np.testing.assert_allclose(batch.advantages[12], 4.0 * 0.5, rtol=1e-5)  # 3 of 4: 0.25 / 0.5
    assert float(extra["focal_weight_mean"]) == pytest.approx(2.5)


def test_registered_zero_weighting_freezes_the_step(model):
    """A weighting that filters every group out: zero advantages, zero gradient, same params."""
    cfg = GRPOConfig(
        group_size=4, max_new_tokens=4, learning_rate=1e-2, weight_decay=0.0, weighting="test_zero"
    )
    trainable, frozen, to_lora = lora_policy(_lora(random_b=True))
    trainer = _trainer(cfg, to_lora)
    state = trainer.init(trainable, jax.random.key(0))
    new, hist = _run(trainer, state, FrozenPolicy(model, frozen), 1)
    m = hist[0]
    assert m["focal_weight_mean"] == 0.0 and m["adv_max"] == 0.0 and m["adv_min"] == 0.0
    assert m["grad_norm"] == 0.0 and m["loss"] == 0.0
    chex.assert_trees_all_equal(new.params, state.params)
