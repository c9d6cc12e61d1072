"""The ESSA loop's own choices: prompts shared or per candidate, strategy settings from the config,
and one step through the library's evolution step on the run's mesh."""

import jax
import numpy as np
import pytest

from essa_jax import lora as lora_lib
from essa_jax.config import base_config
from essa_jax.train.essa import ESSALoop
from essa_jax.train.pipeline import build_run


def _run(tmp_path, **overrides):
    c = base_config()
    c.model.path = "random:tiny"
    c.task.num_train = 64
    c.task.num_heldout = 8
    c.essa.population_size = 4
    c.essa.prompts_per_candidate = 3
    c.essa.greedy = False
    c.generation.max_new_tokens = 2
    for k, v in overrides.items():
        section, field = k.split(".")
        c[section][field] = v
    return build_run(c, str(tmp_path), verbose=False)


def _sft_like_lora(run):
    lora = lora_lib.init_lora(jax.random.PRNGKey(0), run.model_config, run.lora_config)
    return {
        t: a.replace(
            b=0.3 * jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(1), i), a.b.shape)
        )
        for i, (t, a) in enumerate(sorted(lora.items()))
    }


@pytest.mark.parametrize("sampling", ["shared", "per_candidate"])
def test_prompt_sampling(tmp_path, sampling):
    run = _run(tmp_path, **{"essa.prompt_sampling": sampling})
    loop = ESSALoop(run)
    state = loop.init_state(jax.random.PRNGKey(2), _sft_like_lora(run))
    batch, cursor = loop.prompt_batch(state.cursor)
    width = run.train.tokens.shape[1]
    if sampling == "shared":
        assert batch.tokens.shape == (3, width) and len(batch.prompts) == 3
        assert int(cursor["position"]) == 3
    else:
        assert batch.tokens.shape == (4, 3, width) and len(batch.prompts) == 4
        assert all(len(p) == 3 for p in batch.prompts)
        assert batch.fields["answer"][1] != batch.fields["answer"][0] or (
            batch.prompts[1] != batch.prompts[0]
        )
        flat = [p for member in batch.prompts for p in member]
        assert len(set(flat)) == 12  # 12 distinct prompts, consecutive in the epoch's order
        assert int(cursor["position"]) == 12
    new, metrics, tokens = loop.step(state)
    assert int(new.step) == 1 and tokens > 0
    assert int(new.cursor["position"]) == int(cursor["position"])
    assert 0.0 <= metrics["reward"] <= 1.0


def test_strategy_settings_come_from_the_config(tmp_path):
    run = _run(tmp_path, **{"essa.strategy": "openai_es", "essa.learning_rate": 0.003})
    loop = ESSALoop(run)
    assert loop.strategy.learning_rate == 0.003
    assert loop.strategy.population_size == 4
    run = _run(tmp_path, **{"essa.mirrored": True, "essa.sigma_init": 0.7})
    loop = ESSALoop(run)
    assert loop.strategy.mirrored and loop.strategy.sigma_init == 0.7
    # The loop's mesh is every device (the run's one mesh), population axis first.
    assert loop.mesh.shape["pop"] == jax.device_count()
    assert np.asarray(loop.mesh.devices).size == jax.device_count()


def test_a_strategy_with_a_per_coordinate_sigma_and_its_own_args(tmp_path):
    """The loop reads only what the Strategy protocol promises (mean [D], sigma [] or [D]): a
    separable strategy with one step size per coordinate and a hyper-parameter of its own
    (`essa.strategy_args`), and no bookkeeping fields, runs a generation."""
    import dataclasses

    import flax.struct
    import jax.numpy as jnp

    from essa_jax.es import STRATEGIES, register_strategy
    from essa_jax.train import validate_config

    @flax.struct.dataclass
    class State:
        mean: jax.Array
        sigma: jax.Array  # [D]

    @dataclasses.dataclass(frozen=True)
    class PerCoordinate:
        num_dims: int
        population_size: int
        sigma_init: float
        shrink: float = 1.0

        def init(self, key, mean):
            sigma = self.sigma_init * (1.0 + jnp.arange(self.num_dims) / self.num_dims)
            return State(mean=mean, sigma=sigma)

        def ask(self, key, state):
            z = jax.random.normal(key, (self.population_size, self.num_dims))
            return state.mean + state.sigma * z

        def tell(self, state, population, fitness):
            best = population[jnp.argmax(fitness)]
            return State(mean=best, sigma=state.sigma * self.shrink)

    register_strategy("test_per_coordinate", PerCoordinate)
    try:
        overrides = {
            "essa.strategy": "test_per_coordinate",
            "essa.strategy_args": {"shrink": 0.5},
            "essa.skip_flat": False,
        }
        run = _run(tmp_path, **overrides)
        validate_config(run.config, num_devices=jax.device_count())
        loop = ESSALoop(run)
        assert loop.strategy.shrink == 0.5
        state = loop.init_state(jax.random.PRNGKey(0), _sft_like_lora(run))
        sigma0 = np.asarray(state.es.sigma)
        assert sigma0.shape == (loop.layout.size,)
        new, metrics, _ = loop.step(state)
    finally:
        STRATEGIES.pop("test_per_coordinate")
    np.testing.assert_allclose(metrics["sigma"], 0.5 * sigma0.mean(), rtol=1e-6)
    moved = np.linalg.norm(np.asarray(new.es.mean) - np.asarray(state.es.mean))
    assert moved > 0 and metrics["update_norm"] == pytest.approx(moved, rel=1e-6)
