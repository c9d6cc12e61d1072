"""Full-parameter GRPO and SFT (`lora.full`): the update on 1 device equals the update on 8 virtual
devices (data = 8) and on data = 4 x model = 2, after the weights moved; the "projections" subset
trains only the projections; the KL reference is the initial weights; float32 masters keep an
AdamW step of lr 1e-6 that bfloat16 weights round away."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_data_parallel import _max_diff, _meshes, decode, parity_reward, sft_case
from toy_model import TOY_CONFIG as CONFIG

from essa_jax.lora.full import full_policy, merge_weights, no_lora, select_weights
from essa_jax.mesh import make_mesh
from essa_jax.models import init_params
from essa_jax.rl import FrozenPolicy, GRPOConfig, GRPOTrainer, adamw, place_base
from essa_jax.train.sft import train_sft

GROUP = 4


@pytest.fixture(scope="module")
def params():
    return jax.jit(init_params, static_argnums=1)(jax.random.key(0), CONFIG)


def _trainer(cfg, mesh=None, optimizer=None, config=CONFIG):
    """A full-parameter GRPOTrainer of the toy model (`lora.full`: every weight trained)."""
    return GRPOTrainer(
        config,
        cfg,
        to_lora=no_lora,
        to_params=merge_weights,
        reward_fn=parity_reward,
        decode=decode,
        mesh=mesh,
        optimizer=optimizer,
    )


# Adam divides each gradient by its own magnitude, so a weight whose gradient is ~0 (norm entries,
# embedding rows of unsampled tokens) turns summation-order rounding into a step of order lr; the
# layout tests use SGD with momentum after the same clipping, whose step is linear in the gradient
# (and whose momentum is a param-shaped optimiser state, sharded as the weights).
SGD = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.5, momentum=0.9))


def _grpo_step(params, subset, mesh, cfg, num_prompts=3, optimizer=None):
    toks = jax.random.randint(jax.random.key(2), (num_prompts, 3), 3, 16).astype(jnp.int32)
    texts = [f"p{i}" for i in range(num_prompts)]
    trainable, frozen, _ = full_policy(params, subset)
    trainer = _trainer(cfg, mesh, optimizer)
    policy = FrozenPolicy(place_base(params, mesh, CONFIG, shard_data=True), frozen)
    state = trainer.init(trainable, jax.random.key(3))
    new, m = trainer.step(state, policy, toks, jnp.ones_like(toks), texts, answer=texts)
    return trainable, new, m


# 12 rollouts: padded to 16 on 8 devices, two mini-batches of 6 (padded to 8), KL to the initial
# weights, one-row micro-batches.
CFG = GRPOConfig(
    group_size=GROUP,
    max_new_tokens=4,
    learning_rate=1e-2,
    temperature=0.9,
    agg="seq_mean_token_mean",
    beta=0.05,
    num_minibatches=2,
    micro_batch_size=1,
    rows_per_chunk=2,  # per-row sampling keys on one device too: the same rollouts everywhere
)


@pytest.mark.parametrize("subset", ["full", "projections"])
def test_full_grpo_update_is_the_same_on_1_8_and_4x2_devices(params, subset):
    """With "projections" the frozen leaves come from the base, itself split over data."""
    out = {name: _grpo_step(params, subset, m, CFG, optimizer=SGD) for name, m in _meshes().items()}
    trainable, p1, m1 = out["1"]
    assert _max_diff(p1.params, trainable) > 1e-3  # every weight tree moved
    assert 0 < m1["reward_mean"] < 1  # a real gradient
    assert m1["kl"] > 0  # the second mini-batch sees weights off the reference
    for name in ("8", "4x2"):
        _, p, m = out[name]
        # ZeRO: the new masters and AdamW moments stay split over data (here: the q kernel's d).
        for leaf in (
            p.params["layers"]["q"]["kernel"],
            p.opt_state[1][0].trace["layers"]["q"]["kernel"],
        ):
            assert "data" in leaf.sharding.spec, (name, leaf.sharding)
        assert _max_diff(p.params, p1.params) < 5e-6, name
        np.testing.assert_allclose(m["loss"], m1["loss"], rtol=1e-4, atol=1e-7)


def test_projections_subset_trains_only_the_projections(params):
    trainable, new, _ = _grpo_step(params, "projections", _meshes()["1"], CFG)
    assert set(trainable) == {"layers"}
    assert set(trainable["layers"]) == {"q", "k", "v", "o", "gate", "up", "down"}
    assert _max_diff(new.params, trainable) > 1e-3
    merged = merge_weights(new.params, params)
    for k in ("embed", "final_norm"):
        np.testing.assert_array_equal(merged[k], params[k])  # frozen
    for k in ("attn_norm", "mlp_norm"):
        np.testing.assert_array_equal(merged["layers"][k], params["layers"][k])


def test_kl_reference_is_the_initial_weights(params):
    """The reference log-probs of a trained policy are the initial model's, not its own."""
    cfg = GRPOConfig(group_size=GROUP, max_new_tokens=4, temperature=0.9, beta=0.1)
    trainable, frozen, _ = full_policy(params, "full")
    trainer = _trainer(cfg)
    moved = jax.tree.map(lambda x: x * 1.5, trainable)
    toks = jax.random.randint(jax.random.key(5), (4, 6), 3, 16).astype(jnp.int32)
    attn = jnp.ones_like(toks)
    policy = FrozenPolicy(params, frozen)
    pol, ref = trainer.score(policy, moved, toks, attn, with_policy=True, with_ref=True, last=3)
    base_pol, _ = trainer.score(policy, trainable, toks, attn, with_policy=True, last=3)
    assert float(jnp.abs(pol - ref).max()) > 1e-3  # the trained policy moved off the reference
    np.testing.assert_allclose(ref, base_pol, rtol=0, atol=1e-6)


def test_full_sft_is_the_same_on_1_8_and_4x2_devices(params):
    """ZeRO on 8 and 4x2 (masters and AdamW state split over data) = one device."""
    data, sft = sft_case()
    trainable, _, _ = full_policy(params, "full")

    def run(mesh):
        return train_sft(
            trainable, params, CONFIG, data, sft, seed=0, pad_id=0, mesh=mesh,
            to_params=merge_weights,
        )  # fmt: skip

    one = run(None)
    # The trainable is the base's own float32 arrays: the donating step trains a copy of them.
    assert not any(x.is_deleted() for x in jax.tree.leaves(params))
    assert _max_diff(one, trainable) > 1e-3  # the weights moved
    for name, mesh in _meshes().items():
        assert _max_diff(run(mesh), one) < 5e-6, name


def test_float32_masters_keep_a_1e_6_step_that_bfloat16_rounds_away(params):
    """F-GRPO's lr 1e-6 (arXiv 2602.06717): Adam's first step moves each weight by ~lr, below
    bfloat16's spacing (2^-8 relative) for weights of size >~ 1e-4; a float32 master keeps it."""
    bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    opt = adamw(1e-6, 0.0, 1.0)
    grads = jax.tree.map(lambda x: jnp.ones(x.shape, jnp.float32), bf16)

    def step(w):
        upd, _ = opt.update(jax.tree.map(lambda g, x: g.astype(x.dtype), grads, w), opt.init(w), w)
        return optax.apply_updates(w, upd)

    def kept(new, old):  # the mean step taken, as a fraction of the -1e-6 asked for
        w1, w0 = (np.asarray(t["layers"]["q"]["kernel"], np.float64) for t in (new, old))
        return float(np.mean(w1 - w0) / -1e-6)

    assert kept(step(bf16), bf16) < 0.1  # bf16 weights and AdamW state: the step rounds away
    trainable, _, _ = full_policy(bf16, "full")
    master = _trainer(GRPOConfig(group_size=GROUP)).init(trainable, jax.random.key(0)).params
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(master))
    moved = step(master)
    assert abs(kept(moved, master) - 1) < 1e-2
    run = merge_weights(moved, bf16)  # the compute weights: the masters in the base's dtype
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(run))
    assert set(select_weights(params, "full")) == set(params)
    with pytest.raises(ValueError, match="valid are"):
        select_weights(params, "embeddings")


def update_memory(config, params, data, cfg, rows=16, t=7):
    """`memory_analysis` of the compiled full-parameter update (every weight trained) of `config`
    on a data axis of `data` devices: masters, AdamW state and base split as the trainer places
    them, abstract arguments (`params` may be `jax.ShapeDtypeStruct`s), `rows` rows of `t`
    tokens."""
    from essa_jax.rl import RolloutBatch

    trainable, frozen, _ = full_policy(params, "full")
    mesh = make_mesh(pop=1, data=data, devices=jax.devices()[:data])
    trainer = _trainer(cfg, mesh, config=config)
    opt = jax.eval_shape(trainer.optimizer.init, trainable)
    t_sh, o_sh = trainer.state_shardings(trainable, opt)

    def abstract(tree, shardings):
        return jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
        )

    base = jax.eval_shape(lambda p: p, params)
    policy = FrozenPolicy(abstract(base, t_sh), frozen)  # the base placed as the masters
    rows_sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    shape = lambda s, dt: jax.ShapeDtypeStruct(s, dt, sharding=rows_sh)  # noqa: E731
    new = cfg.max_new_tokens
    batch = RolloutBatch(
        tokens=shape((rows, t), jnp.int32),
        attention_mask=shape((rows, t), jnp.int32),
        completion_mask=shape((rows, new), jnp.float32),
        advantages=shape((rows,), jnp.float32),
        ref_logp=shape((rows, new), jnp.float32),
    )
    lowered = trainer.update_step.lower(
        policy, abstract(trainable, t_sh), abstract(opt, o_sh), batch, num_rows=rows
    )
    return lowered.compile().memory_analysis()


def test_weights_and_optimizer_state_per_device_fall_as_1_over_data(params):
    """ZeRO / FSDP over ``data``: the compiled update's per-device argument and output bytes
    (base, float32 masters, AdamW m and v, the batch's rows) fall as 1 / data
    (`memory_analysis`, XLA's buffer assignment)."""
    cfg = GRPOConfig(group_size=GROUP, max_new_tokens=4, beta=0.05)
    one = update_memory(CONFIG, params, 1, cfg)
    # masters + m + v on the one device (the base is no argument: every leaf is trained and the
    # reference log-probs come with the batch, so XLA drops it).
    state = sum(x.size * 4 for x in jax.tree.leaves(params)) * 3
    assert one.argument_size_in_bytes >= state
    for n in (2, 4, 8):
        m = update_memory(CONFIG, params, n, cfg)
        # Only the scalars (AdamW's count) and nothing else stay whole: 1 / n to a few bytes.
        assert m.argument_size_in_bytes <= one.argument_size_in_bytes / n + 64, n
        assert m.output_size_in_bytes <= one.output_size_in_bytes / n + 1024, n
