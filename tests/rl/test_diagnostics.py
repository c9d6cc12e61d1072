"""F-GRPO's training diagnostics (arXiv 2602.06717) in the GRPO step's metrics: the fraction of
prompt groups with every rollout right / wrong, and the sampling policy's mean token entropy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_model import TOY_CONFIG as CONFIG

from essa_jax.lora import LoraConfig, init_lora, lora_policy
from essa_jax.models import init_params, sequence_logprobs
from essa_jax.rl import (
    FrozenPolicy,
    GRPOConfig,
    GRPOTrainer,
    group_outcome_fractions,
    success_rate,
    zero_variance_fraction,
)

# Four groups of N = 4, one of each kind: all right, all wrong, mixed, mixed.
HAND_MADE = (
    [1.0, 1.0, 1.0, 1.0] + [0.0, 0.0, 0.0, 0.0] + [1.0, 0.0, 1.0, 0.0] + [0.0, 0.0, 0.0, 1.0]
)


def test_outcome_fractions_on_a_hand_made_batch():
    rewards = jnp.asarray(HAND_MADE)
    right, wrong = group_outcome_fractions(rewards, 4)
    assert (float(right), float(wrong)) == (0.25, 0.25)
    # Binary rewards: the equal-reward groups are exactly the all-right and all-wrong ones.
    assert float(right + wrong) == float(zero_variance_fraction(rewards, 4)) == 0.5
    # They are the groups whose focal success rate mu is 1 / 0.
    mu = np.asarray(success_rate(rewards, 4)).reshape(4, 4)[:, 0]
    assert float(right) == np.mean(mu == 1.0) and float(wrong) == np.mean(mu == 0.0)


def test_outcome_fractions_graded_and_rescaled_rewards():
    # A graded reward: equal partial rewards are zero-variance but neither right nor wrong.
    graded = jnp.asarray([0.5] * 4 + [1.0] * 4 + [0.0, 0.2, 0.0, 0.0])
    right, wrong = group_outcome_fractions(graded, 4)
    assert float(right) == pytest.approx(1 / 3) and float(wrong) == 0.0
    assert float(zero_variance_fraction(graded, 4)) == pytest.approx(2 / 3)
    # Another reward scale: right = at least r_correct, wrong = at most r_wrong.
    scaled = 2.0 * jnp.asarray(HAND_MADE) - 1.0  # {-1, 1}
    right, wrong = group_outcome_fractions(scaled, 4, r_correct=1.0, r_wrong=-1.0)
    assert (float(right), float(wrong)) == (0.25, 0.25)
    with pytest.raises(ValueError, match="must divide"):
        group_outcome_fractions(jnp.ones(6), 4)


def by_prompt(prompts, completions, answer, **_):
    """Hand-made rewards by prompt: p0 always right, p1 always wrong, p2 and p3 alternate."""
    out = []
    for i, p in enumerate(prompts):
        out.append({"p0": 1.0, "p1": 0.0}.get(p, float(i % 2)))
    return out


def test_step_logs_outcome_fractions_and_the_sampling_policy_entropy():
    params = jax.jit(init_params, static_argnums=1)(jax.random.key(0), CONFIG)
    lora = init_lora(jax.random.key(1), CONFIG, LoraConfig(rank=2, alpha=4.0, targets=("q", "v")))
    lora = {  # B != 0: the adapted policy differs from the base model
        t: ad.replace(b=0.3 * jax.random.normal(jax.random.key(i), ad.b.shape))
        for i, (t, ad) in enumerate(lora.items())
    }
    trainable, frozen, to_lora = lora_policy(lora)
    temperature = 0.7  # the entropy is that of the sampling distribution, logits / T
    cfg = GRPOConfig(group_size=4, max_new_tokens=4, learning_rate=1e-2, temperature=temperature)
    trainer = GRPOTrainer(
        CONFIG,
        cfg,
        to_lora=to_lora,
        reward_fn=by_prompt,
        decode=lambda ids: " ".join(map(str, ids)),
    )
    toks = jax.random.randint(jax.random.key(2), (4, 3), 3, CONFIG.vocab_size).astype(jnp.int32)
    mask = jnp.ones((4, 3), jnp.int32)
    texts = [f"p{i}" for i in range(4)]
    policy = FrozenPolicy(params, frozen)
    state = trainer.init(trainable, jax.random.key(3))
    _, m = trainer.step(state, policy, toks, mask, texts, answer=texts)

    assert (m["all_right_frac"], m["all_wrong_frac"]) == (0.25, 0.25)
    assert m["zero_variance_frac"] == 0.5

    # The same rollouts again (the step's key split), scored by the policy that sampled them.
    _, k_roll, _ = jax.random.split(jax.random.wrap_key_data(state.key), 3)
    gen = trainer.rollout(policy, state.params, toks, mask, k_roll)
    tokens = jnp.concatenate([jnp.repeat(toks, 4, 0), gen.tokens], axis=1)
    attn = jnp.concatenate([jnp.repeat(mask, 4, 0), gen.mask.astype(jnp.int32)], axis=1)
    _, ent = sequence_logprobs(
        params,
        CONFIG,
        tokens,
        attn,
        lora=to_lora(state.params, frozen),
        temperature=temperature,
        return_entropy=True,
    )
    ent = ent[:, -gen.tokens.shape[1] :]  # the entries that predict the completion tokens
    comp = gen.mask.astype(jnp.float32)
    expected = float(jnp.sum(ent * comp) / jnp.sum(comp))
    assert m["entropy"] == pytest.approx(expected, rel=1e-5)
    assert 0.0 < m["entropy"] <= np.log(CONFIG.vocab_size)
