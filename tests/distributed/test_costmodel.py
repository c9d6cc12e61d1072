"""The first-principles cost model (`essa_jax.scaling.costmodel`): arithmetic against hand-computed
cases, the shape counts against the plan's, the published hardware table, limits and errors."""

import dataclasses
import math

import pytest

from essa_jax import plan
from essa_jax.models.shapes import model_shape
from essa_jax.scaling import costmodel as cm

CHIP = dataclasses.replace(
    cm.HARDWARE["H100-SXM"],
    name="toy",
    peak_flops=1e15,
    hbm_bandwidth=1e12,
    intra_node_bandwidth=1e11,
    inter_node_bandwidth=1e10,
    gpus_per_node=4,
    intra_node_latency=1e-6,
    inter_node_latency=1e-5,
)
MODEL = cm.ModelCounts(
    name="toy",
    num_layers=2,
    hidden_size=8,
    dense_flops=2e9,
    attn_flops_per_key=0.0,
    kv_bytes_per_token=1e6,
    weight_bytes=2e9,
)
PROG = cm.GenerationProgram(
    model_devices=1, rows_per_chunk=4, prompt_tokens=10, new_tokens=3, weight_bytes_per_device=2e9
)


def test_generation_time_by_hand():
    # Per chunk of 4 rows: prefill reads the weights and writes 4 x 10 KV tokens (memory-bound):
    # (2e9 + 4e7) / 1e12; decode steps at 11, 12, 13 keys read 2e9 + 4 x ctx x 1e6 bytes.
    prefill = 2.04e-3
    decode = sum((2e9 + 4 * ctx * 1e6) / 1e12 for ctx in (11, 12, 13))
    t = cm.generation_time(8, PROG, MODEL, CHIP)
    assert t["chunks"] == 2
    assert t["prefill"] == pytest.approx(2 * prefill)
    assert t["decode"] == pytest.approx(2 * decode)
    assert t["tp_allreduce"] == 0.0 and t["decode_memory_bound_share"] == 1.0
    assert t["total"] == pytest.approx(2 * (prefill + decode))
    # Fewer rows than a chunk: one chunk of those rows; 0 rows cost nothing.
    assert cm.generation_time(2, PROG, MODEL, CHIP)["chunks"] == 1
    assert cm.generation_time(0, PROG, MODEL, CHIP)["total"] == 0.0
    # Compute-bound when the rows' FLOPs outweigh the weight reads: 1e5 rows x 2e9 FLOP / 1e15.
    big = dataclasses.replace(PROG, rows_per_chunk=10**5, new_tokens=1)
    t = cm.generation_time(10**5, big, dataclasses.replace(MODEL, kv_bytes_per_token=0.0), CHIP)
    assert t["decode"] == pytest.approx(1e5 * 2e9 / 1e15)
    assert t["decode_memory_bound_share"] == 0.0


def test_tensor_parallel_all_reduces_by_hand():
    prog = dataclasses.replace(PROG, model_devices=2, new_tokens=1, tp_bytes_per_row_layer=32.0)
    t = cm.generation_time(4, prog, MODEL, CHIP)
    # 2 layers x 2 all-reduces; prefill of 4 x 10 rows x 16 B, one step of 4 rows x 16 B; ring
    # over 2 devices: 2 latency steps + 2 (n - 1) / n x bytes / NVLink.
    one = 2 * 1e-6 + 640 / 1e11
    step = 2 * 1e-6 + 64 / 1e11
    assert t["tp_allreduce"] == pytest.approx(4 * (one + step))


def test_collectives_by_hand_and_the_link_they_use():
    assert cm.allreduce_time(1e9, 4, CHIP) == pytest.approx(6e-6 + 1.5e9 / 1e11)  # NVLink
    assert cm.allreduce_time(1e9, 8, CHIP) == pytest.approx(14e-5 + 1.75e9 / 1e10)  # IB
    assert cm.allgather_time(800.0, 8, CHIP) == pytest.approx(7e-5 + 700 / 1e10)
    assert cm.allreduce_time(1e9, 1, CHIP) == 0.0 == cm.allgather_time(1e9, 1, CHIP)


def test_essa_generation_by_hand():
    essa = cm.ESSASettings(
        population_size=6, prompts_per_candidate=4, genome_dims=10, num_parents=2,
        eigen_interval=5, es_flops=1e9,
    )  # fmt: skip
    e = cm.essa_generation_time(4, PROG, MODEL, essa, CHIP)
    # 6 members on 4 replicas: the pop axis pads to 8, 2 members x 4 prompts per replica.
    assert e["rows_per_replica"] == 8
    assert e["rollout"] == pytest.approx(cm.generation_time(8, PROG, MODEL, CHIP)["total"])
    assert e["gather_bytes"] == 16 * 24
    assert e["row_gather"] == 0.0  # 4 GPUs = one node = one process
    tell = (2 * 6 * 100 + 2 * 3 * 100 + 4 * 1000 / 5) / 1e9
    assert e["es_tell"] == pytest.approx(tell)
    e8 = cm.essa_generation_time(8, PROG, MODEL, essa, CHIP)  # two nodes: one IB all-gather
    assert e8["row_gather"] == pytest.approx(cm.allgather_time(16 * 24, 2, CHIP))
    assert e8["total"] == pytest.approx(e8["rollout"] + e8["row_gather"] + e8["es_tell"])


def test_grpo_step_by_hand():
    upd = cm.UpdateProgram(micro_batch_rows=2, sequence=13, remat=True, grad_bytes=1e6)
    grpo = cm.GRPOSettings(prompts_per_step=4, group_size=2)
    g = cm.grpo_step_time(8, PROG, upd, MODEL, grpo, CHIP)
    # 8 rollouts over 8 replicas: 1 row each; update = 3 passes over 13 tokens (compute) vs
    # 1 micro-batch x 3 weight reads (memory): 6e-3 s.
    assert g["rows_per_replica"] == 1
    assert g["rollout"] == pytest.approx(cm.generation_time(1, PROG, MODEL, CHIP)["total"])
    assert g["update"] == pytest.approx(max(3 * 13 * 2e9 / 1e15, 3 * 2e9 / 1e12))
    assert g["grad_allreduce"] == pytest.approx(cm.allreduce_time(1e6, 8, CHIP))
    assert g["score"] == 0.0
    parts = ("rollout", "row_gather", "score", "update", "grad_allreduce")
    assert g["total"] == pytest.approx(sum(g[k] for k in parts))
    assert g["weight_allgather"] == g["grad_reducescatter"] == 0.0  # adapters: no ZeRO traffic


def test_full_parameter_grpo_step_by_hand():
    """FSDP over data: the bf16 weights gathered by the rollout and one scoring pass (2e9 each),
    the update's per-layer gathers (two micro-batches, forward and backward: 8e9) and one
    reduce-scatter of the float32 gradient, ring costs over the 8 replicas (2 nodes of 4: IB)."""
    upd = cm.UpdateProgram(
        micro_batch_rows=2,
        sequence=13,
        remat=True,
        grad_bytes=0.0,
        score_passes=1,
        weight_gather_bytes=8e9,
        grad_scatter_bytes=4e9,
        rollout_gather_bytes=2e9,
    )
    grpo = cm.GRPOSettings(prompts_per_step=4, group_size=2)
    g = cm.grpo_step_time(8, PROG, upd, MODEL, grpo, CHIP)
    gathers = 2 * (7 * 1e-5 + 7 / 8 * 2e9 / 1e10) + (7 * 1e-5 + 7 / 8 * 8e9 / 1e10)
    assert g["weight_allgather"] == pytest.approx(gathers)
    assert g["grad_reducescatter"] == pytest.approx(7 * 1e-5 + 7 / 8 * 4e9 / 1e10)
    assert g["grad_allreduce"] == 0.0
    parts = ("rollout", "row_gather", "score", "update", "grad_allreduce", "weight_allgather")
    assert g["total"] == pytest.approx(sum(g[k] for k in (*parts, "grad_reducescatter")))


def test_fsdp_bytes_scale_with_micro_batches_and_rings_span_replicas_times_model():
    """The update's FSDP bytes, counted in a compile of 4 micro-batches per device, fall with the
    micro-batches each device runs; a data ring over r replicas of `model` g GPUs spans r x g
    GPUs (here 2 replicas x 4 = 8 > the node's 4: InfiniBand, not NVLink)."""
    upd = cm.UpdateProgram(
        micro_batch_rows=2, sequence=13, remat=True, grad_bytes=0.0,
        weight_gather_bytes=8e9, grad_scatter_bytes=4e9, compiled_micro_batches=4,
    )  # fmt: skip
    grpo = cm.GRPOSettings(prompts_per_step=4, group_size=2)  # 8 rows
    tp = dataclasses.replace(PROG, model_devices=4)
    g = cm.grpo_step_time(8, tp, upd, MODEL, grpo, CHIP)  # r = 2 replicas of 4 rows: 2 micro
    ib = cm._link(8, CHIP)
    assert ib == (CHIP.inter_node_bandwidth, CHIP.inter_node_latency)
    assert g["weight_allgather"] == pytest.approx(ib[1] + 1 / 2 * (2 / 4 * 8e9) / ib[0])
    assert g["grad_reducescatter"] == pytest.approx(ib[1] + 1 / 2 * (2 / 4 * 4e9) / ib[0])
    one_node = cm.grpo_step_time(4, dataclasses.replace(PROG, model_devices=2), upd, MODEL, grpo,
                                 CHIP)  # fmt: skip
    nv = (CHIP.intra_node_bandwidth, CHIP.intra_node_latency)
    assert one_node["grad_reducescatter"] == pytest.approx(nv[1] + 1 / 2 * (2 / 4 * 4e9) / nv[0])


def test_shape_counts_match_the_plan_and_the_published_sizes():
    mc = model_shape("Qwen2.5-32B")
    m = cm.ModelCounts.from_config(mc, "Qwen2.5-32B")
    # One token attending one key: the plan's model_flops (the same count, two codes).
    assert m.dense_flops + m.attn_flops_per_key == pytest.approx(plan.model_flops(mc, 1, 1))
    assert m.kv_bytes_per_token == 64 * 2 * 8 * 128 * 2  # layers x K,V x kv heads x hd x bf16
    assert m.weight_bytes == pytest.approx(65.5e9, rel=0.01)  # ~32.8e9 parameters in bf16


def test_hardware_table_holds_the_published_h100_figures():
    h = cm.HARDWARE["H100-SXM"]
    assert (h.peak_flops, h.hbm_bandwidth, h.memory_bytes) == (989e12, 3.35e12, 80e9)
    assert h.intra_node_bandwidth == 900e9 / 2 and h.inter_node_bandwidth == 400e9 / 8
    assert "datasheet" in h.source


def test_compare_with_paper_arithmetic():
    essa = {16: 100.0, 128: 20.0}
    grpo = {16: 50.0, 128: 25.0}
    c = cm.compare_with_paper(essa, grpo)
    assert c["reported_essa_scaling"] == 10.0 and c["reported_grpo_scaling"] == 400 / 150
    assert c["reported_speedup_growth"] == pytest.approx((150 / 20) / 2)
    assert c["predicted_essa_scaling"] == 5.0 and c["predicted_grpo_scaling"] == 2.0
    assert c["predicted_speedup_growth"] == pytest.approx(2.5)  # (25/50) / (20/100)
    assert c["implied_step_ratio"] == pytest.approx(2 * 100 / 50)
    assert c["speedup_large_at_reported_small"] == pytest.approx(5.0)
    assert "predicted_speedup_small" not in c  # no step counts, no speedup
    s = cm.compare_with_paper(essa, grpo, step_ratio=3.0)
    assert s["predicted_speedup_small"] == pytest.approx(3.0 * 50 / 100)
    assert s["predicted_speedup_large"] == pytest.approx(3.0 * 25 / 20)
    assert s["predicted_speedup_large"] / s["predicted_speedup_small"] == pytest.approx(
        c["predicted_speedup_growth"]
    )


def test_larger_clusters_never_slow_a_step_down_and_decode_hits_the_weight_floor():
    mc = model_shape("Qwen2.5-32B")
    m = cm.ModelCounts.from_config(mc)
    h = cm.HARDWARE["H100-SXM"]
    prog = cm.GenerationProgram(4, 240, 512, 1024, m.weight_bytes / 4, 2.0 * m.hidden_size * 2)
    essa = cm.ESSASettings()
    t = [cm.essa_generation_time(n, prog, m, essa, h)["total"] for n in (8, 16, 32, 64, 128)]
    assert all(a >= b for a, b in zip(t, t[1:], strict=False))
    # One row per replica: every decode step reads the device's weights once.
    one = cm.generation_time(1, prog, m, h)
    floor = 1024 * m.weight_bytes / 4 / h.hbm_bandwidth
    assert floor <= one["decode"] <= 1.1 * floor
    assert math.isclose(one["decode_memory_bound_share"], 1.0)


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match="num_gpus"):
        cm.essa_generation_time(0, PROG, MODEL, cm.ESSASettings(), CHIP)
    prog2 = dataclasses.replace(PROG, model_devices=4)
    with pytest.raises(ValueError, match="model=4"):
        cm.essa_generation_time(6, prog2, MODEL, cm.ESSASettings(), CHIP)
