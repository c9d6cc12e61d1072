"""Data-parallel GRPO and SFT (`GRPOTrainer(mesh=)`, `train_sft(mesh=)`; docs/ARCHITECTURE.md,
"Data-parallel GRPO and SFT"): the update on 1 device equals the update on 8 devices (data=8) and
on data=4 x model=2 (weights replicated) to float rounding, padding rows and micro-batches
included; rollouts are the per-row-key samples whatever the layout."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_model import TOY_CONFIG as CONFIG

from essa_jax.config import ConfigError, base_config
from essa_jax.lora import LoraConfig, init_lora, lora_policy
from essa_jax.mesh import make_mesh
from essa_jax.models import init_params
from essa_jax.rl import FrozenPolicy, GRPOConfig, GRPOConfigError, GRPOTrainer, place_base
from essa_jax.train.pipeline import check_data_parallel
from essa_jax.train.rollouts import PromptSet
from essa_jax.train.sft import train_sft

GROUP = 4


def _meshes():
    return {
        "1": make_mesh(pop=1, data=1, devices=jax.devices()[:1]),
        "8": make_mesh(pop=1, data=8),
        "4x2": make_mesh(pop=1, data=4, model=2),
    }


def decode(ids):
    return " ".join(str(i) for i in ids)


def parity_reward(prompts, completions, **fields):
    assert len(prompts) == len(completions) == len(fields["answer"])
    return [float(sum(map(int, c.split())) % 2 == 0) for c in completions]


@pytest.fixture(scope="module")
def setup():
    params = jax.jit(init_params, static_argnums=1)(jax.random.key(0), CONFIG)
    lora = init_lora(jax.random.key(1), CONFIG, LoraConfig(rank=2, alpha=4.0), jnp.float32)
    lora = {  # an "SFT" adapter: B != 0
        t: a.replace(b=0.3 * jax.random.normal(jax.random.key(i), a.b.shape))
        for i, (t, a) in enumerate(lora.items())
    }
    return params, lora


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def _max_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(_leaves(a), _leaves(b), strict=True))


# 3 prompts x 4 = 12 rollouts: padded to 16 on 8 devices, two mini-batches of 6 (padded to 8), the
# sequence-mean aggregation (whose denominator counts rows), KL to the base, 1-row micro-batches.
PADDED = dict(num_prompts=3, agg="seq_mean_token_mean", beta=0.05, num_minibatches=2, mbs=1)
# 4 prompts x 4 = 16 rollouts, one update, token mean, micro-batches of 2 rows per device.
EVEN = dict(num_prompts=4, agg="token_mean", beta=0.0, num_minibatches=1, mbs=2)


@pytest.mark.parametrize("case", [PADDED, EVEN], ids=["padded", "even"])
def test_grpo_update_is_the_same_on_1_8_and_4x2_devices(setup, case):
    params, lora = setup
    cfg = GRPOConfig(
        group_size=GROUP,
        max_new_tokens=4,
        learning_rate=1e-2,
        temperature=0.9,
        agg=case["agg"],
        beta=case["beta"],
        num_minibatches=case["num_minibatches"],
        micro_batch_size=case["mbs"],
        # Per-row keys on every layout: a one-device mesh is one device, which with the default
        # rows_per_chunk = 0 samples the batch with one key (`models.generate`'s draws); with
        # chunks of at least the rows, each layout generates its rows at once, row r with
        # fold_in(key, r), as every mesh did before the one step (re-pinned for #29).
        rows_per_chunk=16,
    )
    num_prompts = case["num_prompts"]
    toks = jax.random.randint(jax.random.key(2), (num_prompts, 3), 3, 16).astype(jnp.int32)
    mask = jnp.ones_like(toks)
    texts = [f"p{i}" for i in range(num_prompts)]
    trainable, frozen, to_lora = lora_policy(lora)
    out = {}
    for name, mesh in _meshes().items():
        trainer = GRPOTrainer(
            CONFIG, cfg, to_lora=to_lora, reward_fn=parity_reward, decode=decode, mesh=mesh
        )
        policy = FrozenPolicy(place_base(params, mesh, CONFIG), frozen)
        state = trainer.init(trainable, jax.random.key(3))
        new, m = trainer.step(state, policy, toks, mask, texts, answer=texts)
        out[name] = (new.params, m)
    rows = num_prompts * GROUP
    p1, m1 = out["1"]
    assert _max_diff(p1, trainable) > 1e-3  # the LoRA moved
    assert 0 < m1["reward_mean"] < 1  # rewards differ within the batch: a real gradient
    for name in ("8", "4x2"):
        p, m = out[name]
        assert _max_diff(p, p1) < 5e-6, name
        # Same rollouts (per-row keys), so the same rewards and lengths, exactly.
        for k in ("reward_mean", "reward_std", "completion_len_mean", "truncation_rate"):
            assert m[k] == m1[k], (name, k)
        np.testing.assert_allclose(m["loss"], m1["loss"], rtol=1e-4, atol=1e-7)
        for k in ("adv_mean", "adv_std", "adv_min", "adv_max", "ratio_mean"):
            np.testing.assert_allclose(m[k], m1[k], rtol=1e-5, atol=1e-6, err_msg=k)
        assert m["local_rollouts"] == rows  # one process generated every rollout
    if case is PADDED:
        # The mesh's rollouts are the one-device trainer's per-row samples (rows_per_chunk > 0).
        one = GRPOTrainer(
            CONFIG,
            GRPOConfig(group_size=GROUP, max_new_tokens=4, temperature=0.9, rows_per_chunk=rows),
            to_lora=to_lora,
            reward_fn=parity_reward,
            decode=decode,
        )
        sharded = GRPOTrainer(
            CONFIG,
            GRPOConfig(group_size=GROUP, max_new_tokens=4, temperature=0.9),
            to_lora=to_lora,
            reward_fn=parity_reward,
            decode=decode,
            mesh=_meshes()["8"],
        )
        key = jax.random.key(7)
        want = one.rollout(FrozenPolicy(params, frozen), trainable, toks, mask, key)
        mesh = sharded.mesh
        got = sharded.rollout(
            FrozenPolicy(place_base(params, mesh, CONFIG), frozen),
            place_base(trainable, mesh, CONFIG),
            toks,
            mask,
            jax.random.key_data(key),
        )
        assert got.tokens.shape[0] == 16  # padded to the 8 devices
        np.testing.assert_array_equal(np.asarray(got.tokens)[:rows], want.tokens)
        np.testing.assert_array_equal(np.asarray(got.lengths)[:rows], want.lengths)


def sft_case():
    """(PromptSet, sft settings) of the layout tests of SFT: 12 examples, some left-padded; batch
    6, padded to 8 rows on 8 devices (1 per device) and on 4 (2 per device)."""
    rng = np.random.default_rng(0)
    n = 12
    toks = rng.integers(3, 16, (n, 5)).astype(np.int32)
    mask = np.ones_like(toks)
    toks[::3, :2], mask[::3, :2] = 0, 0  # some left padding
    targets = [list(rng.integers(3, 16, 1 + i % 4)) + [2] for i in range(n)]
    data = PromptSet([f"p{i}" for i in range(n)], toks, mask, {}, targets)
    sft = SimpleNamespace(
        learning_rate=1e-2,
        weight_decay=0.0,
        max_grad_norm=1.0,
        steps=2,
        batch_size=6,
        micro_batch_size=1,
    )
    return data, sft


def test_sft_update_is_the_same_on_1_8_and_4x2_devices(setup):
    params, lora = setup
    data, sft = sft_case()

    def run(mesh):
        lo = jax.tree.map(jnp.copy, lora)  # the step donates its LoRA
        return train_sft(lo, params, CONFIG, data, sft, seed=0, pad_id=0, mesh=mesh)

    one = run(None)
    assert _max_diff(one, lora) > 1e-3  # the LoRA moved
    for name, mesh in _meshes().items():
        got = run(mesh)
        assert all(not isinstance(x, jax.Array) or len(x.devices()) == 1 for x in _leaves(got))
        assert _max_diff(got, one) < 5e-6, name


def test_micro_batch_size_counts_rows_per_device(setup):
    # 16 rollouts over data=4: 4 rows per device; 3 does not divide them (though 16 % 2 == 0 for 2).
    with pytest.raises(GRPOConfigError, match="4 rollouts each of the data=4 devices"):
        GRPOConfig(group_size=2, micro_batch_size=3).check_batch(16, data=4)
    GRPOConfig(group_size=2, micro_batch_size=2).check_batch(16, data=4)
    # 12 rows over data=8: padded to 16, 2 per device.
    GRPOConfig(group_size=2, micro_batch_size=2).check_batch(12, data=8)
    with pytest.raises(GRPOConfigError, match="micro_batch_size counts rows per device"):
        GRPOConfig(group_size=2, micro_batch_size=4).check_batch(12, data=8)

    c = base_config()
    c.method = "grpo"
    c.grpo.batch_size, c.grpo.group_size, c.grpo.micro_batch_size = 32, 8, 4
    check_data_parallel(c, make_mesh(pop=1, data=8))
    c.grpo.micro_batch_size = 8  # divides the batch of 32, not the 4 rows per device
    with pytest.raises(ConfigError, match="grpo.micro_batch_size"):
        check_data_parallel(c, make_mesh(pop=1, data=8))
    c.grpo.micro_batch_size = 0
    c.sft.batch_size, c.sft.micro_batch_size = 16, 4  # 2 rows per device of 8
    with pytest.raises(ConfigError, match="sft.micro_batch_size"):
        check_data_parallel(c, make_mesh(pop=1, data=8))
