"""The RL settings of an experiment config (essa_jax.config.grpo_config) and the registries."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from essa_jax.config import (
    GRPO_CONFIG_FIELDS,
    ConfigError,
    base_config,
    grpo_config,
)
from essa_jax.rl import (
    GRPOConfig,
    estimator_names,
    get_estimator,
    get_weighting,
    register_estimator,
    register_weighting,
    weighting_names,
)
from essa_jax.train import get_method, validate_config


def _config(method="grpo", **overrides):
    c = base_config()
    c.method = method
    c.model.path = "random:tiny"
    if method == "fgrpo":
        c.grpo.focal_gamma = 0.5
    for key, value in overrides.items():
        block, name = key.split(".")
        c[block][name] = value
    return c


def test_every_grpo_config_field_comes_from_the_experiment_config():
    c = _config()
    for f in dataclasses.fields(GRPOConfig):
        path = GRPO_CONFIG_FIELDS.get(f.name, "grpo." + f.name)
        if path != "method":
            block, name = path.split(".")
            assert name in c[block], path
    # The defaults of the new fields are GRPOConfig's own (results do not change).
    defaults = GRPOConfig()
    g = grpo_config(c)
    for name in ("epochs", "num_minibatches", "top_k", "top_p", "use_generation_logprobs",
                 "adv_ddof", "adv_eps", "max_len", "r_correct", "r_wrong", "adam_b1", "adam_b2",
                 "adam_eps"):  # fmt: skip
        assert getattr(g, name) == getattr(defaults, name), name
    assert (g.max_new_tokens, g.advantage, g.learning_rate) == (6, "group", 1e-4)


@pytest.mark.parametrize(
    "method, overrides, weighting, gamma",
    [
        ("grpo", {}, "none", 0.0),
        ("svdgrpo", {}, "none", 0.0),
        ("fgrpo", {}, "focal", 0.5),  # the preset
        ("grpo", {"grpo.weighting": "focal", "grpo.focal_gamma": 0.5}, "focal", 0.5),
    ],
)
def test_method_maps_to_the_weighting(method, overrides, weighting, gamma):
    c = _config(method, **overrides)
    validate_config(c, num_devices=1)
    g = get_method(method).variant.rl_config(c)
    assert (g.weighting, g.gamma) == (weighting, gamma)


def test_weighting_chosen_by_name_with_its_parameters():
    @register_weighting("test_above", overwrite=True)
    def above(rewards, group_size, cfg):
        return (rewards > cfg.weighting_kwargs["threshold"]).astype(rewards.dtype)

    c = _config(**{"grpo.weighting": "test_above", "grpo.weighting_args": {"threshold": 0.5}})
    validate_config(c, num_devices=1)
    g = grpo_config(c)
    assert (g.weighting, g.weighting_kwargs) == ("test_above", {"threshold": 0.5})
    hash(g)  # a jit static argument
    w = get_weighting(g.weighting)(jnp.array([0.0, 1.0, 0.4, 0.6]), 2, g)
    np.testing.assert_array_equal(w, [0.0, 1.0, 0.0, 1.0])
    # Its parameter missing: the weighting cannot run, found before any weight is read.
    with pytest.raises(ConfigError) as e:
        validate_config(_config(**{"grpo.weighting": "test_above"}), num_devices=1)
    assert e.value.field == "grpo.weighting_args" and "threshold" in str(e.value)
    with pytest.raises(ConfigError) as e:
        validate_config(_config(**{"grpo.weighting": "nope"}), num_devices=1)
    assert e.value.field == "grpo.weighting" and "'test_above'" in str(e.value)
    # fgrpo is the focal preset: another weighting there is a contradiction, named.
    with pytest.raises(ConfigError) as e:
        validate_config(_config("fgrpo", **{"grpo.weighting": "test_above"}), num_devices=1)
    assert e.value.field == "grpo.weighting"


def test_overrides_reach_the_grpo_config():
    c = _config(
        "fgrpo",
        **{
            "grpo.loss": "cispo",
            "grpo.eps_low": 1.0,
            "grpo.eps_high": 5.0,
            "grpo.adv_scale": "none",
            "grpo.agg": "seq_mean_token_sum_norm",
            "grpo.max_len": 12,
            "grpo.epochs": 2,
            "grpo.num_minibatches": 2,
            "grpo.top_k": 5,
            "generation.max_new_tokens": 9,
        },
    )
    validate_config(c, num_devices=1)
    g = get_method(c.method).variant.rl_config(c)
    assert (g.loss, g.eps_low, g.eps_high, g.advantage, g.agg) == (
        "cispo", 1.0, 5.0, "none", "seq_mean_token_sum_norm",
    )  # fmt: skip
    assert (g.max_len, g.norm_len, g.epochs, g.num_minibatches, g.top_k, g.max_new_tokens) == (
        12, 12, 2, 2, 5, 9,
    )  # fmt: skip


@pytest.mark.parametrize(
    "key, value, field",
    [
        ("grpo.loss", "ppo", "grpo.loss"),
        ("grpo.agg", "sum", "grpo.agg"),
        ("grpo.adv_scale", "std", "grpo.adv_scale"),
        ("grpo.top_p", 0.0, "grpo.top_p"),
        ("grpo.epochs", 0, "grpo.epochs"),
        ("grpo.learning_rate", 0.0, "grpo.learning_rate"),
        ("grpo.beta", -1.0, "grpo.beta"),
        ("grpo.eps_low", 1.0, "grpo.eps_low"),
        ("grpo.adv_ddof", 2, "grpo.adv_ddof"),
        ("grpo.num_minibatches", 3, "grpo.num_minibatches"),
    ],
)
def test_validation_names_the_config_field(key, value, field):
    with pytest.raises(ConfigError) as e:
        validate_config(_config(**{key: value}), num_devices=1)
    assert e.value.field == field, str(e.value)
    assert f"config.{field} = {value!r}" in str(e.value)


def test_fgrpo_negative_gamma_names_focal_gamma():
    with pytest.raises(ConfigError) as e:
        validate_config(_config("fgrpo", **{"grpo.focal_gamma": -0.5}), num_devices=1)
    assert e.value.field == "grpo.focal_gamma"


def test_registries():
    assert set(estimator_names()) >= {"group", "batch", "none"}
    assert set(weighting_names()) >= {"none", "focal"}
    with pytest.raises(ValueError, match="unknown advantage estimator 'rloo'.*'group'"):
        get_estimator("rloo")
    with pytest.raises(ValueError, match="unknown advantage weighting 'hard'.*'focal'"):
        get_weighting("hard")
    with pytest.raises(ValueError, match="already registered"):
        register_weighting("focal", lambda r, n, cfg: r)
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("group", lambda r, n, cfg: r)

    # A user estimator (RLOO: leave-one-out baseline), registered as a decorator, used by name.
    @register_estimator("test_rloo", overwrite=True)
    def rloo(rewards, group_size, cfg):
        x = rewards.reshape(-1, group_size)
        return (x - (x.sum(1, keepdims=True) - x) / (group_size - 1)).reshape(-1)

    cfg = GRPOConfig(group_size=4, advantage="test_rloo")
    r = jnp.array([1.0, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(
        get_estimator(cfg.advantage)(r, 4, cfg), [1.0, -1 / 3, -1 / 3, -1 / 3]
    )
