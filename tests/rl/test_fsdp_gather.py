"""FSDP proper (ZeRO-3, Rajbhandari et al. 2020, arXiv 1910.02054): full-parameter programs gather
each layer's weights inside the layer scan (`mesh.gather_outside_layers`,
`models.hidden_states(gather=)`) and the gathers' transposes reduce-scatter the gradient.

- the gradient with a per-layer gather equals the plain one: on one device (gather = identity,
  the checkpoint policy that drops the gathered weights from the residuals in place) and on 8
  devices (weights split over ``data``, each device's rows);
- the compiled update's per-device temporaries no longer hold the whole model (XLA's
  `memory_analysis`): they fall with the data axis by at least the weights the device no longer
  holds, beside arguments that fall as 1 / data.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from test_full_params import update_memory
from toy_model import TOY_CONFIG

from essa_jax.mesh import (
    data_only,
    data_psum_unsplit,
    gather_outside_layers,
    make_mesh,
    over_data,
    param_specs,
    place_params,
)
from essa_jax.models import init_params, sequence_logprobs
from essa_jax.rl import GRPOConfig

# The toy decoder with biases and an untied head: every kind of leaf (stacked kernels and biases,
# norms, embedding, lm_head) is split over data = 8 and gathered.
UNTIED = dataclasses.replace(TOY_CONFIG, tie_embeddings=False, attention_bias=True, num_layers=3)
EPS = float(jnp.finfo(jnp.float32).eps)


def _batch(rows=16, t=7):
    tokens = jax.random.randint(jax.random.key(1), (rows, t), 3, 16).astype(jnp.int32)
    # left padding on a few rows, so masked positions are part of the check
    mask = jnp.ones((rows, t), jnp.int32).at[::3, :2].set(0)
    return tokens, mask


def _logp_sum(params, config, tokens, mask, remat, gather=None):
    lp = sequence_logprobs(params, config, tokens, mask, remat=remat, gather=gather)
    return jnp.sum(lp)


def _tolerance(g, terms):
    """float32 summation-order bound of a gradient entry summed over `terms` partial sums (rows
    and positions): a reordered sum of n terms differs by at most ~n eps x sum |terms|, here
    bounded by n eps x max |g| x n (each partial at most the whole's scale)."""
    scale = max(float(np.abs(np.asarray(x)).max()) for x in jax.tree.leaves(g))
    return terms * terms * EPS * scale


@pytest.mark.parametrize("config", [TOY_CONFIG, UNTIED], ids=["tied", "untied_bias"])
@pytest.mark.parametrize("remat", [False, True])
def test_identity_gather_keeps_the_gradient(config, remat):
    """One device: the gather is the identity, but the layer runs under the checkpoint policy that
    saves everything except the (named) gathered weights; the gradient is the plain one."""
    params = init_params(jax.random.key(0), config)
    tokens, mask = _batch()
    plain = jax.jit(jax.value_and_grad(_logp_sum), static_argnums=(1, 4))
    hooked = jax.jit(
        jax.value_and_grad(lambda p, c, t, m, r: _logp_sum(p, c, t, m, r, gather=lambda x: x)),
        static_argnums=(1, 4),
    )
    v0, g0 = plain(params, config, tokens, mask, remat)
    v1, g1 = hooked(params, config, tokens, mask, remat)
    assert float(jnp.abs(g0["layers"]["q"]["kernel"]).max()) > 1e-4  # a real gradient
    np.testing.assert_allclose(v1, v0, rtol=16 * EPS)
    tol = _tolerance(g0, 4)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=tol)


def _sharded_gradient(params, config, specs, mesh, remat):
    """(the jitted FSDP gradient program over `mesh`: weights split as `specs`, each device's
    rows, per-layer gathers; its placed arguments; the one-device gradient of the same batch)."""
    tokens, mask = _batch()
    placed = place_params(params, mesh, config, shard_data=True)

    def body(p, tokens, mask):
        def loss(p):
            weights, gather = gather_outside_layers(p, specs, mesh)
            return _logp_sum(weights, config, tokens, mask, remat, gather)

        return data_psum_unsplit(jax.grad(loss)(p), specs, mesh)

    data_specs = jax.tree.map(data_only, specs)
    rows = P("data")
    sharded = jax.jit(over_data(body, mesh, (data_specs, rows, rows), data_specs))
    place_rows = lambda x: jax.device_put(x, NamedSharding(mesh, rows))  # noqa: E731
    g1 = jax.jit(jax.grad(_logp_sum), static_argnums=(1, 4))(params, config, tokens, mask, remat)
    return sharded, (placed, place_rows(tokens), place_rows(mask)), g1


@pytest.mark.parametrize("config", [TOY_CONFIG, UNTIED], ids=["tied", "untied_bias"])
@pytest.mark.parametrize("remat", [False, True])
def test_per_layer_gather_on_8_devices_equals_one_device(config, remat):
    """data = 8: weights split over data enter the shard_map, the non-layer leaves are gathered
    once and each layer inside the scan; the gradient arrives reduce-scattered (per leaf, the
    device's shard of the sum over all devices' rows) and equals the one-device gradient."""
    params = init_params(jax.random.key(0), config)
    mesh = make_mesh(pop=1, data=8)
    specs = param_specs(params, config, 1, 8)
    assert specs["layers"]["q"]["kernel"] == P(None, None, "data")  # split, not replicated
    sharded, args, g1 = _sharded_gradient(params, config, specs, mesh, remat)
    g8 = sharded(*args)
    assert float(jnp.abs(g1["layers"]["q"]["kernel"]).max()) > 1e-4
    # the gradient comes back split as the weights (ZeRO-3: no device holds it whole)
    assert "data" in g8["layers"]["q"]["kernel"].sharding.spec
    tol = _tolerance(g1, 8)
    for a, b in zip(jax.tree.leaves(g8), jax.tree.leaves(g1), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=tol)


# 16 layers of [64 -> 256] MLPs and a 16-token vocabulary: the weights (~1M float32) dwarf a
# batch of 16 rows x 7 tokens' activations, so the update's memory is the weights'.
DEEP = dataclasses.replace(
    TOY_CONFIG, hidden_size=64, intermediate_size=256, num_layers=16, head_dim=16
)


def test_update_temporaries_hold_no_whole_model():
    """ZeRO-3 / FSDP: the update's temporaries per device fall as 1 / data, not only its
    arguments (gathered weights live one layer at a time, gradients are reduce-scattered per
    layer, the gathered weights are no residual of the backward pass).

    Bytes: W = the float32 weights (= the compute copy here: the base is float32), W_l = one
    layer's, W_o = the rest (embedding, final norm). On one device the temporaries hold the whole
    gradient, the update and AdamW's intermediates (>= W). On N devices a device holds 1/N of
    each of those, plus what does not split: one layer's gathered weights (forward, or
    re-gathered in the backward pass) and that layer's whole gradient before its reduce-scatter
    (2 W_l), and the non-layer leaves gathered and their gradient (2 W_o): temp(N) <= temp(1) / N
    + 2 W_l + 2 W_o. Before the per-layer gather (the whole model gathered at the program's
    start and one micro-batch's whole gradient, data = 8: 10.4 MB here) and with the gathered
    weights saved as residuals (5.6 MB) this fails; now 1.8 MB."""
    params = jax.eval_shape(lambda: init_params(jax.random.key(0), DEEP))
    W = sum(x.size * 4 for x in jax.tree.leaves(params))
    W_l = sum(x.size * 4 for x in jax.tree.leaves(params["layers"])) // DEEP.num_layers
    W_o = W - W_l * DEEP.num_layers
    cfg = GRPOConfig(group_size=4, max_new_tokens=4, beta=0.05)
    one = update_memory(DEEP, params, 1, cfg)
    assert one.temp_size_in_bytes >= W  # the whole gradient
    temps = {1: one.temp_size_in_bytes}
    for n in (2, 4, 8):
        m = update_memory(DEEP, params, n, cfg)
        temps[n] = m.temp_size_in_bytes
        bound = one.temp_size_in_bytes / n + 2 * W_l + 2 * W_o
        assert m.temp_size_in_bytes <= bound, (n, temps, bound, W)
        # the arguments (masters, AdamW m and v, base) fall as 1 / n, to AdamW's scalar count
        assert m.argument_size_in_bytes <= one.argument_size_in_bytes / n + 64, n
    assert temps[8] < W / 2  # no device holds a whole copy of the weights among its temporaries


@pytest.mark.parametrize("remat", [False, True])
def test_gather_keeps_the_model_split(remat):
    """data = 4 x model = 2: each device gathers over ``data`` only its ``model`` shard of a layer
    (and reduce-scatters that shard's gradient); it never gathers a weight over ``model``, which
    XLA does to a collective's operand in a program manual over ``data`` alone (then every
    device holds and moves whole layers: the 32B plan's update moved 4x the bytes). The gradient
    equals the one-device gradient."""
    from essa_jax.scaling import comm

    config = UNTIED
    params = init_params(jax.random.key(0), config)
    mesh = make_mesh(pop=1, data=4, model=2)
    specs = param_specs(params, config, 2, 4)
    assert specs["layers"]["up"]["kernel"] == P(None, "data", "model")
    sharded, args, g1 = _sharded_gradient(params, config, specs, mesh, remat)
    hlo = sharded.lower(*args).compile().as_text()
    sizes = dict(mesh.shape)
    gathers = [c for c in comm.parse_collectives(hlo, 8) if c.kind == "all-gather"]
    axes = {comm.mesh_axes(c.first_group, sizes) for c in gathers}
    assert axes == {("data",)}, [(c.shapes, comm.mesh_axes(c.first_group, sizes)) for c in gathers]
    # The largest gathered value: one layer's up kernel's model shard, not the whole kernel.
    up = params["layers"]["up"]["kernel"]
    assert max(c.payload_bytes for c in gathers) == up[0].size * up.dtype.itemsize // 2

    g = sharded(*args)
    tol = _tolerance(g1, 8)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g1), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=tol)
