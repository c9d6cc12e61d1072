"""Cost model: arithmetic against hand-computed cases, monotonicity and limits."""

import math

import pytest

from essa_jax.scaling import costmodel as cm

TOY = cm.ModelSpec(
    "toy", n_params=1e9, num_layers=2, hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=4
)
HW = cm.Hardware(
    hbm_bandwidth=1e12,
    interconnect_bandwidth=1e9,
    collective_latency=1e-6,
    peak_flops=1e15,
    train_mfu=0.5,
    host_flops=1e12,
)
WL = cm.Workload(
    prompt_tokens=10,
    mean_completion_tokens=20,
    max_completion_tokens=50,
    concurrent_rows=4,
    gen_tokens_per_s=1000.0,
)


def test_generation_time_by_hand():
    # t_tok = 1 ms, t_mem = 2e9 B / 1e12 B/s = 2 ms.
    # b=8: steps = max(50, 2 waves x 20) = 50 -> 8 x 30 x 1e-3 + 50 x 2e-3 = 0.34 s.
    assert cm.generation_time(8, TOY, HW, WL) == pytest.approx(0.34)
    # b=12: 3 waves x 20 = 60 steps -> 0.36 + 0.12.
    assert cm.generation_time(12, TOY, HW, WL) == pytest.approx(0.48)
    assert cm.generation_time(0, TOY, HW, WL) == 0.0
    # Two GPUs per replica halve both per-token and per-step costs.
    wl2 = cm.Workload(**{**WL.__dict__, "gpus_per_replica": 2})
    assert cm.generation_time(8, TOY, HW, wl2) == pytest.approx(0.17)


def test_collective_times_by_hand():
    assert cm.allreduce_time(1e9, 4, HW) == pytest.approx(6e-6 + 1.5)
    assert cm.allgather_time(400.0, 8, HW) == pytest.approx(2e-6 * 3 + 7 / 8 * 400 / 1e9)
    assert cm.allreduce_time(1e9, 1, HW) == 0.0 == cm.allgather_time(1e9, 1, HW)


def test_essa_and_grpo_step_by_hand():
    essa = cm.ESSASettings(population_size=8, prompts_per_candidate=4, rank=1, num_targets=1)
    e = cm.essa_generation_time(4, TOY, essa, HW, WL)
    d = 2 * 1 * 1 * 2  # layers x targets x rank x 2
    assert e["rollout"] == pytest.approx(cm.generation_time(8, TOY, HW, WL))
    assert e["fitness_allgather"] == pytest.approx(2e-6 * 2 + 3 / 4 * 32 / 1e9)
    assert e["es_update"] == pytest.approx((2 * 8 * d * d + 10 * d**3) / 1e12)
    assert e["total"] == pytest.approx(e["rollout"] + e["fitness_allgather"] + e["es_update"])

    grpo = cm.GRPOSettings(prompts_per_step=4, group_size=2, trainable="full", switch_seconds=1.0)
    g = cm.grpo_step_time(2, TOY, grpo, HW, WL)
    tokens = 8 * 30
    assert g["rollout"] == pytest.approx(cm.generation_time(4, TOY, HW, WL))
    assert g["old_logprobs"] == pytest.approx(tokens * 2e9 / (2 * 1e15 * 0.5))
    assert g["forward_backward"] == pytest.approx(tokens * 6e9 / (2 * 1e15 * 0.5))
    assert g["grad_allreduce"] == pytest.approx(2e-6 + 1e9 * 4 / 1e9)
    assert g["weight_sync"] == pytest.approx(2e9 / 1e9)
    assert g["switch"] == 1.0


def test_qwen_lora_and_genome_sizes():
    # Qwen2.5-7B, rank 2, q/k/v/o: 28 x 4 x 2 x 2 = 448 (ESSA Sec. 3).
    assert cm.QWEN25_7B.essa_genome_dims(2) == 448
    # q: 3584 -> 3584, k/v: 3584 -> 512, o: 3584 -> 3584; r (in + out) each, 28 layers.
    assert cm.QWEN25_7B.lora_params(8) == 28 * 8 * (7168 + 4096 + 4096 + 7168)


def test_monotone_and_limits():
    model, wl = cm.QWEN25_32B, cm.Workload(gpus_per_replica=2)
    gpus = (8, 16, 32, 64, 128)
    essa = [cm.essa_generation_time(n, model, workload=wl)["total"] for n in gpus]
    grpo = [cm.grpo_step_time(n, model, workload=wl)["total"] for n in gpus]
    assert all(a > b for a, b in zip(essa, essa[1:], strict=False))
    assert all(a >= b for a, b in zip(grpo, grpo[1:], strict=False))
    # Past one rollout per replica nothing shrinks: the step time is the latency floor.
    floor_essa = cm.essa_generation_time(2 * 96 * 100, model, workload=wl)
    assert floor_essa["rollout"] == pytest.approx(cm.generation_time(1, model, cm.Hardware(), wl))
    big = cm.grpo_step_time(2 * 1024 * 64, model, workload=wl)
    assert big["total"] > cm.GRPOSettings().switch_seconds + big["rollout"]
    # Throughput-bound regime (no tail, unlimited KV rows): ESSA scales linearly.
    wl_lin = cm.Workload(
        max_completion_tokens=1,
        concurrent_rows=10**9,
        gpus_per_replica=1,
        mean_completion_tokens=600,
        prompt_tokens=0,
    )
    hw_free = cm.Hardware(hbm_bandwidth=math.inf, host_flops=math.inf)
    t = {
        n: cm.essa_generation_time(n, cm.QWEN25_7B, hw=hw_free, workload=wl_lin)["total"]
        for n in (8, 96)
    }
    eff = cm.scaling_efficiency(t)
    assert eff[96] == pytest.approx(1.0, rel=1e-3)


def test_time_to_target_calibration():
    out = cm.time_to_target((16, 128), cm.QWEN25_32B, workload=cm.Workload(gpus_per_replica=2))
    r16, r128 = out["rows"]
    assert r16["essa_minutes"] == pytest.approx(200.0)
    assert r16["grpo_minutes"] == pytest.approx(400.0)
    assert r16["speedup"] == pytest.approx(2.0)
    # The 128-GPU speedup is 2 x (GRPO's step-time ratio) / (ESSA's step-time ratio).
    want = (
        2.0
        * (r128["grpo_step_s"] / r16["grpo_step_s"])
        / (r128["essa_step_s"] / r16["essa_step_s"])
    )
    assert r128["speedup"] == pytest.approx(want)
    assert r128["speedup"] > r16["speedup"]
    assert out["essa_steps"] * r16["essa_step_s"] == pytest.approx(200 * 60)


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match="gpus_per_replica=2"):
        cm.essa_generation_time(3, cm.QWEN25_32B, workload=cm.Workload(gpus_per_replica=2))
    with pytest.raises(ValueError, match="num_gpus"):
        cm.grpo_step_time(0, cm.QWEN25_7B)
    with pytest.raises(ValueError, match="trainable"):
        cm.grpo_step_time(8, cm.QWEN25_7B, cm.GRPOSettings(trainable="half"))
    with pytest.raises(ValueError, match="calibrate_at"):
        cm.time_to_target((16,), cm.QWEN25_7B, calibrate_at=32)
    with pytest.raises(ValueError, match="targets"):
        cm.QWEN25_7B.lora_params(8, ("q", "mlp"))
