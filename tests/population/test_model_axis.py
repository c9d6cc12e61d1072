"""ESSA's population program with a ``model`` axis (tensor parallelism inside the (pop, data)
shard_map): the evaluator places the weights split over it, fitness equals the run without it, the
memory estimate divides by it, and config.mesh.model is validated against devices and heads."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from pop_helpers import left_padded, randn

from essa_jax.config import ConfigError, base_config, check_mesh_model
from essa_jax.lora import LoraConfig, svd_factorize
from essa_jax.memory import (
    generation_bytes_per_row,
    kv_cache_bytes,
    param_bytes,
    tree_bytes,
)
from essa_jax.mesh import make_mesh
from essa_jax.models import init_cache, init_params, tiny_model_config
from essa_jax.population import PopulationEvaluator, PromptBatch
from essa_jax.train import validate_config

T, N = 5, 6


def _setup():
    """The "tp" preset (16 heads / 8 KV heads, q/k/v biases) with an SFT-like adapter on every
    projection (so row-parallel o / down adapters run too)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lora"))
    from lora_helpers import random_lora

    config = tiny_model_config("tp")
    params = jax.tree.map(
        lambda x: 4.0 * x, jax.jit(init_params, static_argnums=1)(jax.random.key(0), config)
    )
    targets = ("q", "k", "v", "o", "gate", "up", "down")
    sft = random_lora(11, config, LoraConfig(rank=2, alpha=4.0, targets=targets))
    basis, layout = svd_factorize(sft, 1.0)
    tokens, mask = left_padded(1, (3, T), 99)
    batch = PromptBatch(tokens, mask, [f"p{j}" for j in range(3)])
    return config, params, basis, layout, batch


def _score(rows):
    """Mean log-prob of each row's completion: continuous, so any row mix-up shows."""
    g = rows.generation
    return (np.asarray(g.logprobs) * g.mask).sum(-1) / np.maximum(g.mask.sum(-1), 1)


def _evaluator(config, params, layout, mesh, greedy, **kw):
    return PopulationEvaluator(
        params,
        config,
        layout,
        mesh=mesh,
        score=_score,
        max_new_tokens=N,
        greedy=greedy,
        temperature=1.2,
        eos_token_ids=(),
        **kw,
    )


@pytest.mark.parametrize(
    "pop, data, model, chunk, greedy",
    # 5 members x 3 prompts padded to the mesh; the last in chunks of 2 rows (lax.map).
    [(2, 2, 2, 0, True), (2, 2, 2, 0, False), (4, 1, 2, 0, True), (2, 1, 4, 2, False)],
)
def test_fitness_with_a_model_axis_equals_without(pop, data, model, chunk, greedy):
    config, params, basis, layout, batch = _setup()
    genomes = 0.5 * randn(0, (5, layout.size))
    mesh = make_mesh(pop=pop, data=data, model=model)
    want = _evaluator(config, params, layout, None, greedy)(
        basis, genomes, batch, jax.random.key(2)
    )
    ev = _evaluator(config, params, layout, mesh, greedy, rows_per_chunk=chunk)
    got = ev(basis, genomes, batch, jax.random.key(2))
    np.testing.assert_array_equal(got.lengths, want.lengths)
    np.testing.assert_allclose(got.fitness, want.fitness, atol=1e-5)
    np.testing.assert_allclose(got.rewards, want.rewards, atol=1e-5)
    assert np.ptp(want.fitness) > 1e-3  # members differ: a mix-up would show
    q = ev.params["layers"]["q"]["kernel"]
    assert q.sharding.spec == P(None, None, "model")
    assert {s.data.shape for s in q.addressable_shards} == {(2, 32, 32 // model)}


def test_memory_estimate_divides_by_the_model_axis():
    config, params, basis, layout, batch = _setup()
    cache = init_cache(config, 3, 10, jnp.bfloat16)
    split = 2 * config.num_layers * 3 * config.num_kv_heads * 10 * config.head_dim * 2
    assert kv_cache_bytes(config, 3, 10, jnp.bfloat16, model_shards=4) == (
        tree_bytes(cache) - split + split // 4
    )
    per_row = {
        m: generation_bytes_per_row(config, T, N, jnp.float32, model_shards=m) for m in (1, 2)
    }
    assert per_row[2] < per_row[1]
    # The evaluator reserves its device's shard of the weights and sizes rows per model shard.
    genomes = jax.ShapeDtypeStruct((8, layout.size), jnp.float32)
    tok = jax.ShapeDtypeStruct((16, T), jnp.int32)
    abstract = PromptBatch(tok, tok, [])
    reserved = {1: param_bytes(config, jnp.float32), 2: param_bytes(config, jnp.float32, 2)}
    chunks = {}
    for m in (1, 2):
        mesh = make_mesh(pop=4, data=1, model=m, devices=jax.devices()[: 4 * m])
        memory = int((reserved[1] + tree_bytes(basis) + 3.5 * per_row[1]) / 0.9)
        ev = _evaluator(config, params, layout, mesh, True, device_memory_bytes=memory)
        assert tree_bytes(ev.params, per_device=True) == reserved[m]
        chunks[m] = ev.rows_per_chunk_for(basis, genomes, abstract)
    assert chunks[1] == 3 and chunks[2] > chunks[1]  # 32 rows per device: 11 chunks of 3


def test_abstract_params_lower_split_over_the_model_axis():
    """The plan's evaluator: abstract (ShapeDtypeStruct) weights get the model-split shardings,
    and the program compiles with each device's weights ~1/model."""
    config, params, basis, layout, _ = _setup()
    sds = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)  # noqa: E731
    mesh = make_mesh(pop=2, data=2, model=2)
    ev = _evaluator(config, sds(params), layout, mesh, True)
    q = ev.params["layers"]["q"]["kernel"]
    assert isinstance(q, jax.ShapeDtypeStruct) and q.sharding.spec == P(None, None, "model")
    tok = jax.ShapeDtypeStruct((4, T), jnp.int32)
    lowered = ev.lower(
        sds(basis),
        jax.ShapeDtypeStruct((4, layout.size), jnp.float32),
        PromptBatch(tok, tok, []),
        jax.ShapeDtypeStruct((2,), jnp.uint32),
    )
    args = lowered.compile().memory_analysis().argument_size_in_bytes
    assert args < param_bytes(config, jnp.float32, 2) + tree_bytes(basis) + 4096


def _tiny(**over):
    c = base_config()
    c.model.path = "random:tp"
    for k, v in over.items():
        block, leaf = k.split(".")
        c[block][leaf] = v
    return c


def test_config_mesh_model_is_validated_against_devices_and_heads():
    for model in (1, 2, 4, 8):
        validate_config(_tiny(**{"mesh.model": model}), num_devices=8)
    validate_config(_tiny(**{"mesh.data": 2, "mesh.model": 4}), num_devices=8)
    with pytest.raises(ConfigError) as e:
        validate_config(_tiny(**{"mesh.data": 2, "mesh.model": 8}), num_devices=8)
    assert e.value.field == "mesh.model" and "valid values are [1, 2, 4]" in str(e.value)
    with pytest.raises(ConfigError) as e:  # random:tiny has 2 KV heads
        validate_config(_tiny(**{"model.path": "random:tiny", "mesh.model": 4}), num_devices=8)
    msg = str(e.value)
    assert e.value.field == "mesh.model" and "config.mesh.model = 4 is invalid" in msg
    assert "valid values are [1, 2]" in msg and "num_kv_heads=2" in msg
    for bad in (0, 3, True):
        with pytest.raises(ConfigError, match="mesh.model"):
            validate_config(_tiny(**{"mesh.model": bad}), num_devices=8)
    # A shape known only once loaded (the ESSA loop's check): the same message.
    with pytest.raises(ConfigError) as e:
        check_mesh_model(_tiny(**{"mesh.model": 4}).mesh, 8, tiny_model_config("tiny"))
    assert str(e.value) == msg


def test_plan_compiles_the_population_split_over_the_model_axis():
    """essa_jax.plan's population program on a pop=2 x model=2 mesh: the weights are an argument
    of each device at half their size."""
    from essa_jax import plan as plan_lib

    c = _tiny(**{"mesh.model": 2, "essa.population_size": 4, "essa.prompts_per_candidate": 2})
    c.task.max_prompt_tokens, c.generation.max_new_tokens, c.lora.rank = 8, 3, 2
    c.model.dtype = "float32"  # the plan's "auto" is bfloat16 (accelerators); bytes counted in f32
    target = plan_lib.make_target(None, 4, 1.0)
    (pop,) = plan_lib.plan_config(c, target, programs=["essa_population"])
    assert pop.fits and pop.mesh == {"pop": 2, "data": 1, "model": 2}
    weights = param_bytes(tiny_model_config("tp"), jnp.float32)
    assert weights / 2 <= pop.argument_bytes < weights * 0.6


def test_essa_loop_steps_with_a_model_axis_and_checks_the_loaded_shape(tmp_path):
    from essa_jax.train.essa import ESSALoop
    from essa_jax.train.pipeline import build_run

    c = _tiny(**{"mesh.model": 2, "essa.population_size": 4, "essa.prompts_per_candidate": 2})
    c.model.path, c.task.num_train, c.task.num_heldout = "random:tiny", 16, 4
    c.generation.max_new_tokens = 2
    run = build_run(c, str(tmp_path), verbose=False)
    loop = ESSALoop(run)
    assert dict(loop.mesh.shape) == {"pop": 4, "data": 1, "model": 2}
    q = loop.evaluator.params["layers"]["q"]["kernel"]
    assert q.sharding.spec == P(None, None, "model")
    from essa_jax import lora as lora_lib

    lora = lora_lib.init_lora(jax.random.key(0), run.model_config, run.lora_config)
    lora = {t: a.replace(b=0.3 + 0 * a.b) for t, a in lora.items()}  # non-zero B: an SFT-like start
    new, metrics, tokens = loop.step(loop.init_state(jax.random.key(2), lora))
    assert int(new.step) == 1 and tokens > 0 and np.isfinite(metrics["reward"])
    c.mesh.model = 4  # random:tiny has 2 KV heads: refused once the model is loaded
    with pytest.raises(ConfigError, match=r"valid values are \[1, 2\]"):
        ESSALoop(build_run(c, str(tmp_path / "b"), verbose=False))
