"""The row exchange, the shard_map and the micro-batch rule of `essa_jax.mesh` that the population
and the GRPO step share (docs/ARCHITECTURE.md, "Data-parallel GRPO and SFT")."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from essa_jax.mesh import (
    DATA_AXIS,
    POP_AXIS,
    allgather_owned,
    data_all_gather,
    data_psum,
    local_blocks,
    make_mesh,
    over_data,
    rows_per_device_problem,
)


def test_local_blocks_read_each_real_entry_once():
    # A [4, 6] grid of real entries padded to [4, 8], split 2 x 2 over (pop, data) and
    # replicated over model = 2: each block is held twice, read once, padding dropped.
    mesh = make_mesh(pop=2, data=2, model=2)
    grid = np.arange(32, dtype=np.int32).reshape(4, 8)
    other = -grid
    sharding = NamedSharding(mesh, P(POP_AXIS, DATA_AXIS))
    arrays = [jax.device_put(x, sharding) for x in (grid, other)]
    blocks = local_blocks(arrays, (4, 6))
    assert [starts for starts, _ in blocks] == [(0, 0), (0, 4), (2, 0), (2, 4)]
    seen = np.zeros((4, 8), int)
    for (r0, c0), (g, o) in blocks:
        np.testing.assert_array_equal(g, grid[r0 : r0 + g.shape[0], c0 : c0 + g.shape[1]])
        np.testing.assert_array_equal(o, -g)
        seen[r0 : r0 + g.shape[0], c0 : c0 + g.shape[1]] += 1
    assert (seen[:, :6] == 1).all() and (seen[:, 6:] == 0).all()


def test_allgather_owned_checks_ownership():
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(allgather_owned(values, np.ones(3, bool)), values)
    with pytest.raises(RuntimeError, match="none or several"):
        allgather_owned(values, np.array([True, False, True]))


def test_over_data_is_the_body_on_one_device_and_sums_over_data():
    def body(x):
        return data_psum(jnp.sum(x, keepdims=True), mesh), data_all_gather(x * 2, mesh)

    mesh = make_mesh(pop=1, data=1, devices=jax.devices()[:1])
    assert over_data(body, mesh, P(DATA_AXIS), (P(), P())) is body
    text = jax.jit(over_data(body, mesh, P(DATA_AXIS), (P(), P()))).lower(jnp.ones(8)).as_text()
    assert "all-reduce" not in text and "all_reduce" not in text and "all_gather" not in text
    mesh = make_mesh(pop=1, data=8)
    x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P(DATA_AXIS)))
    total, doubled = jax.jit(over_data(body, mesh, P(DATA_AXIS), (P(), P())))(x)
    assert float(total[0]) == float(jnp.sum(jnp.arange(16.0)))
    np.testing.assert_array_equal(np.asarray(doubled), 2 * np.arange(16.0))


def test_rows_per_device_rule():
    assert rows_per_device_problem(0, 12, 8, "rows", "a batch") is None
    assert rows_per_device_problem(2, 12, 8, "rows", "a batch") is None  # ceil(12 / 8) = 2
    assert rows_per_device_problem(4, 12, 1, "rows", "a batch") is None
    one = rows_per_device_problem(5, 12, 1, "rollouts", "a mini-batch of 12")
    assert one == "0 or a divisor of the 12 rollouts of a mini-batch of 12"
    many = rows_per_device_problem(4, 12, 8, "rows", "sft.batch_size=12")
    assert "the 2 rows each of the data=8 devices" in many and "counts rows per device" in many
