"""Communication accounting: HLO counts of compiled collectives equal the counts by construction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from essa_jax.scaling import comm


def _mesh(n):
    return jax.make_mesh((n,), ("population",), axis_types=(AxisType.Auto,))


@pytest.mark.parametrize("n_dev,pop", [(8, 96), (4, 24), (2, 8)])
def test_fitness_gather_hlo_equals_construction(n_dev, pop):
    mesh = _mesh(n_dev)

    def gather(f):
        return jax.lax.all_gather(f, "population", tiled=True)

    fn = jax.jit(
        jax.shard_map(gather, mesh=mesh, in_specs=P("population"), out_specs=P(), check_vma=False)
    )
    got = comm.hlo_collectives(fn, jax.ShapeDtypeStruct((pop,), jnp.float32))
    want = comm.essa_generation_bytes(pop, n_dev)
    assert [c.kind for c in got] == ["all-gather"]
    assert got[0].group_size == n_dev
    assert got[0].payload_bytes == want.payload_bytes == 4 * pop
    assert got[0].wire_bytes_per_device == pytest.approx(want.wire_bytes_per_device)
    assert want.wire_bytes_per_device == pytest.approx(4 * pop * (n_dev - 1) / n_dev)


def test_replicating_a_sharded_fitness_is_one_allgather():
    # The GSPMD route (jit with a replicated out_sharding) must also move only P floats.
    mesh = _mesh(8)
    x = jax.device_put(jnp.arange(96.0), NamedSharding(mesh, P("population")))
    fn = jax.jit(lambda a: a * 2.0, out_shardings=NamedSharding(mesh, P()))
    s = comm.count_collectives(fn, x)
    assert s.num_ops == 1 and s.by_kind == {"all-gather": 96 * 4.0}


def test_gradient_allreduce_of_known_pytree():
    mesh = _mesh(8)
    # A LoRA-like gradient pytree: 2 layers, rank 4, q (16 -> 16) and v (16 -> 8) factors.
    grads = {
        "q": {"a": jnp.zeros((2, 4, 16)), "b": jnp.zeros((2, 16, 4))},
        "v": {"a": jnp.zeros((2, 4, 16)), "b": jnp.zeros((2, 8, 4))},
    }
    nbytes = comm.tree_bytes(grads)
    assert nbytes == 4 * (2 * 4 * 16 + 2 * 16 * 4 + 2 * 4 * 16 + 2 * 8 * 4)

    def local_grad(per_shard_batch, g):
        # Data-parallel: each device holds a gradient, the mean is a psum over the axis.
        del per_shard_batch
        return jax.tree.map(lambda a: jax.lax.psum(a, "population") / 8, g)

    fn = jax.jit(
        jax.shard_map(
            local_grad,
            mesh=mesh,
            in_specs=(P("population"), P()),
            out_specs=P(),
            check_vma=False,
        )
    )
    got = comm.count_collectives(fn, jnp.zeros((8, 3)), grads)
    want = comm.grpo_step_bytes(nbytes, 8)
    assert set(got.by_kind) == {"all-reduce"}
    assert got.payload_bytes == want.payload_bytes == nbytes
    assert got.wire_bytes_per_device == pytest.approx(want.wire_bytes_per_device)
    assert want.wire_bytes_per_device == pytest.approx(2 * 7 / 8 * nbytes)


def test_reduce_scatter_permute_all_to_all_sizes():
    mesh = _mesh(8)

    def k(x):
        a = jax.lax.psum_scatter(x, "population", tiled=True)
        b = jax.lax.ppermute(x, "population", [(i, (i + 1) % 8) for i in range(8)])
        c = jax.lax.all_to_all(x, "population", 0, 0, tiled=True)
        return a, b, c

    fn = jax.jit(jax.shard_map(k, mesh=mesh, in_specs=P("population"), out_specs=P("population")))
    got = {c.kind: c for c in comm.hlo_collectives(fn, jax.ShapeDtypeStruct((128,), jnp.float32))}
    local = 16 * 4  # bytes of each device's [16] f32 shard
    assert got["reduce-scatter"].payload_bytes == local
    assert got["reduce-scatter"].wire_bytes_per_device == pytest.approx(7 / 8 * local)
    assert got["collective-permute"].payload_bytes == local
    assert got["collective-permute"].num_pairs == 8
    assert got["collective-permute"].wire_bytes_per_device == local
    assert got["all-to-all"].payload_bytes == local
    assert got["all-to-all"].wire_bytes_per_device == pytest.approx(7 / 8 * local)


def test_parse_async_and_iota_groups():
    # GPU-style async collectives and iota replica groups: count the -done half once.
    text = "\n".join(
        [
            "  %ags = (bf16[4,8]{1,0}, bf16[16,8]{1,0}) all-gather-start(%p), channel_id=1, "
            "replica_groups=[2,4]<=[8], dimensions={0}",
            "  %agd = bf16[16,8]{1,0} all-gather-done(%ags)",
            "  %ar = f32[10]{0} all-reduce-done(%ars)",
            "  %ars = f32[10]{0} all-reduce-start(%q), replica_groups={{0,1},{2,3}}, to_apply=%add",
            "  %use = f32[10]{0} add(%all-reduce.1, %all-gather.2)",
        ]
    )
    got = comm.parse_collectives(text, num_devices=8)
    assert [(c.kind, c.payload_bytes) for c in got] == [("all-gather", 256.0), ("all-reduce", 40.0)]
    # Groups come from the -start half: iota [2,4] -> 4 devices, {{0,1},{2,3}} -> 2.
    assert got[0].group_size == 4 and got[0].wire_bytes_per_device == pytest.approx(3 / 4 * 256)
    assert got[1].group_size == 2 and got[1].wire_bytes_per_device == pytest.approx(40.0)


def test_replica_groups_name_their_mesh_axes():
    """Which mesh axes a collective spans, from its first replica group: on data 2 x model 4 a
    group of size 2 is the data axis, of size 4 the model axis; on data 4 x model 4 (the 32B
    GRPO plan's mesh) only the ids tell the two apart. Both HLO spellings of the groups."""
    iota = "  %ag = f32[8]{0} all-gather(%p), replica_groups=[4,2]<=[2,4]T(1,0), dimensions={0}"
    (c,) = comm.parse_collectives(iota, num_devices=8)
    assert c.first_group == (0, 4) and c.group_size == 2
    assert comm.mesh_axes(c.first_group, {"data": 2, "model": 4}) == ("data",)
    sizes = {"pop": 1, "data": 4, "model": 4}
    assert comm.mesh_axes((0, 4, 8, 12), sizes) == ("data",)
    assert comm.mesh_axes((4, 5, 6, 7), sizes) == ("model",)
    assert comm.mesh_axes(tuple(range(16)), sizes) == ("data", "model")
    assert comm.mesh_axes((), sizes) == ("data", "model")  # no groups: every device
    with pytest.raises(ValueError, match="beyond the mesh"):
        comm.mesh_axes((0, 16), sizes)

    # A compiled program: psums over each axis and both of a (data 2, model 4) mesh.
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)

    def body(x):
        return (
            jax.lax.psum(x, "data"),
            jax.lax.psum(x * 2, "model"),
            jax.lax.psum(x * 3, ("data", "model")),
        )

    fn = jax.shard_map(body, mesh=mesh, in_specs=P("data", "model"), out_specs=P(), check_vma=False)
    got = comm.hlo_collectives(fn, jax.ShapeDtypeStruct((4, 8), jnp.float32))
    axes = sorted(comm.mesh_axes(c.first_group, {"data": 2, "model": 4}) for c in got)
    assert axes == [("data",), ("data", "model"), ("model",)], got


def test_construction_counts_and_errors():
    e = comm.essa_generation_bytes(96, 16, seed_bytes=8)
    assert e.payload_bytes == 96 * 12
    assert comm.essa_generation_bytes(96, 1).wire_bytes_per_device == 0.0
    g = comm.grpo_step_bytes(1000.0, 4, updates_per_step=3, weight_sync_bytes=500.0)
    assert g.payload_bytes == 3500.0
    assert g.wire_bytes_per_device == pytest.approx(3 * 2 * 3 / 4 * 1000 + 3 / 4 * 500)
    with pytest.raises(ValueError, match="num_devices"):
        comm.essa_generation_bytes(96, 0)
    with pytest.raises(ValueError, match="kind"):
        comm.ring_wire_bytes("broadcast", 1.0, 2)
    assert comm.tree_bytes({"x": np.zeros((3, 2), np.float16)}) == 12


def test_collective_inside_scan_counts_every_iteration():
    # A per-layer all-reduce inside lax.scan (how a layer-stacked LoRA gradient is reduced)
    # executes once per layer; the static HLO holds it once.
    mesh = _mesh(8)
    layers = 3

    def f(x, w):
        def body(c, wl):
            return jax.lax.psum(c @ wl, "population"), None

        return jax.lax.scan(body, x, w)[0]

    fn = jax.jit(
        jax.shard_map(
            f,
            mesh=mesh,
            in_specs=(P("population"), P()),
            out_specs=P("population"),
            check_vma=False,
        )
    )
    got = comm.hlo_collectives(fn, jnp.zeros((8, 4)), jnp.zeros((layers, 4, 4)))
    assert len(got) == 1 and got[0].count == layers and got[0].trip_count_known
    s = comm.summarize(got)
    assert s.num_ops == layers and s.payload_bytes == layers * 4 * 4


@pytest.mark.slow
def test_tiny_model_lora_gradient_allreduce_equals_construction():
    # GRPO's data-parallel cost: the LoRA gradient of the real (tiny) model, batch sharded over 8
    # devices, adapter replicated. GSPMD reduces it per layer inside the layer scan.
    from essa_jax.scaling.probe import lora_gradient_traffic

    got = lora_gradient_traffic()
    assert got["hlo_by_kind"] == {"all-reduce": float(got["lora_bytes"])}
    assert got["hlo_payload_bytes"] == got["construction_payload_bytes"] == got["lora_bytes"]
    assert got["hlo_wire_bytes_per_device"] == pytest.approx(
        got["construction_wire_bytes_per_device"]
    )
