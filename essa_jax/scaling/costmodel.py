"""A cost model of ESSA generations and GRPO steps on a GPU cluster, and of time-to-target.

Purpose: explain (not reproduce to the minute) the scaling ESSA reports (arXiv 2507.04453, Sec. 5,
Qwen2.5-32B on PRM800K, time to 0.835 accuracy): about 2x faster than GRPO on 16 GPUs and about 6x
on 128 (GRPO 400 -> 150 min, ESSA 200 -> under 20 min).

Model (every symbol is a field below; all assumptions are explicit):

*Replicas.* G GPUs hold R = G / g model replicas of g GPUs each (tensor parallel for rollouts;
g = 1 for 7B, 2 for 32B on 80 GB GPUs). Replicas never talk during generation.

*Decoding* b sequences on one replica (prompt p tokens, completions of mean length l and longest
length l_max, sampled until every row stops):

    t_gen(b) = b (p + l) t_tok  +  n_steps(b) t_mem,   n_steps(b) = max(l_max, ceil(b / c) l)

- t_tok = 1 / (g x T_gen): the per-token compute time, T_gen the measured (or given) single-GPU
  generation throughput at a large batch (tokens/s); prefill tokens are charged at the same rate.
- t_mem = weight_bytes / (g x HBM bandwidth): one decode step reads every weight once, whatever the
  batch (the memory-bound floor of small batches).
- c: the concurrent rows a replica's KV cache holds; a batch larger than c runs in waves. The
  longest completion l_max bounds the number of steps from below: the rollout phase ends when its
  slowest row does (the "long tail" of RL rollouts).

*ESSA generation* (Sec. 3): P candidates x B prompts = P B rollouts spread over R replicas (prompts
of one candidate may be split over replicas, so b = ceil(P B / R)), then an all-gather of P fitness
floats (ring: latency 2 alpha log2(G) + (G-1)/G x 4P / bw) and the CMA-ES update every process
repeats (O(P D^2 + D^3) flops on one device; D = genome length).

*GRPO step* (F-GRPO Sec. 2; the usual colocated trainer, e.g. verl): Q prompts x N rollouts over R
replicas (b = ceil(Q N / R)), then on all G GPUs (data parallel, training MFU u):
old-policy log-probs (2 n_params flops per token) and forward+backward (4 n_params flops/token for
LoRA: the base is frozen but activation gradients flow through it; 6 n_params for full
fine-tuning), one ring all-reduce of the trainable gradient per optimizer update
(2 alpha (G-1) + 2 (G-1)/G x bytes / bw), the trainable weights synced to the rollout engine
(bytes / bw), and a fixed switch cost between the generation and training layouts
(KV-cache release / re-allocation, resharding; verl-like systems spend seconds here).

*Time to target* = steps x time per step. The papers report minutes, not step counts, so the step
counts are calibrated: steps = reported minutes / predicted step time at the calibration size
(16 GPUs). The speedup at 16 GPUs is then the reported one by construction; the speedup at 128 GPUs
is a prediction of the model (it depends only on how each method's step time scales from 16 to 128).

Not modelled: stragglers beyond l_max, reward computation (CPU, the same for both), evaluation
passes, pipeline/asynchronous RL (overlapping rollouts with training), data loading, GPU failures.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Decoder shape numbers the cost model needs (defaults: Qwen2.5 configs on the HF hub)."""

    name: str
    n_params: float  # total parameters
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    bytes_per_param: float = 2.0  # bf16 inference and gradients

    @property
    def weight_bytes(self) -> float:
        return self.n_params * self.bytes_per_param

    @property
    def flops_per_token(self) -> float:
        """Forward flops per token, 2 n_params (Kaplan et al. 2020; attention over short contexts
        is a few percent and left out)."""
        return 2.0 * self.n_params

    def lora_params(self, rank: int, targets: tuple[str, ...] = ("q", "k", "v", "o")) -> int:
        """LoRA factor parameters r (in + out) per target and layer."""
        d, q, kv = (
            self.hidden_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        )
        dims = {"q": (d, q), "k": (d, kv), "v": (d, kv), "o": (q, d)}
        bad = [t for t in targets if t not in dims]
        if bad:
            raise ValueError(f"targets {bad} are invalid: valid values are {tuple(dims)}")
        return self.num_layers * sum(rank * (dims[t][0] + dims[t][1]) for t in targets)

    def essa_genome_dims(self, rank: int, num_targets: int = 4) -> int:
        """ESSA genome length: layers x matrices x rank x 2 (s_A and s_B; ESSA Sec. 3)."""
        return self.num_layers * num_targets * rank * 2


QWEN25_7B = ModelSpec("Qwen2.5-7B", 7.62e9, 28, 3584, 28, 4, 128)
QWEN25_32B = ModelSpec("Qwen2.5-32B", 32.76e9, 64, 5120, 40, 8, 128)
MODELS = {m.name: m for m in (QWEN25_7B, QWEN25_32B)}


@dataclasses.dataclass(frozen=True)
class Hardware:
    """One GPU and the network (defaults: H100 SXM 80 GB, 400 Gb/s InfiniBand per GPU)."""

    peak_flops: float = 989e12  # dense bf16
    hbm_bandwidth: float = 3.35e12  # bytes/s
    interconnect_bandwidth: float = 50e9  # bytes/s per GPU across nodes (400 Gb/s)
    collective_latency: float = 10e-6  # alpha, seconds per ring hop
    decode_mfu: float = 0.3  # fraction of peak reached by large-batch decoding
    train_mfu: float = 0.4  # fraction of peak reached by training forward/backward
    host_flops: float = 1e12  # fp32 flops/s of the device running the CMA-ES update (eigh)


@dataclasses.dataclass(frozen=True)
class Workload:
    """Sequence lengths and rollout-engine settings shared by both methods."""

    prompt_tokens: int = 200  # p
    mean_completion_tokens: int = 600  # l
    max_completion_tokens: int = 2048  # l_max (the tail that ends a rollout phase)
    concurrent_rows: int = 256  # c: rows a replica's KV cache holds at once
    gpus_per_replica: int = 1  # g
    gen_tokens_per_s: float | None = None  # T_gen per GPU; None = peak x decode_mfu / (2 n)


@dataclasses.dataclass(frozen=True)
class ESSASettings:
    """ESSA defaults (Sec. 4): population 96, 100 prompts per candidate, rank 8, q/k/v/o."""

    population_size: int = 96  # P
    prompts_per_candidate: int = 100  # B
    rank: int = 8
    num_targets: int = 4
    fitness_bytes: int = 4


@dataclasses.dataclass(frozen=True)
class GRPOSettings:
    """GRPO settings: group N = 8 (F-GRPO Sec. 4); prompts per step, updates, LoRA or full."""

    prompts_per_step: int = 128  # Q (our assumption: the ESSA paper does not state GRPO's batch)
    group_size: int = 8  # N
    updates_per_step: int = 1  # optimizer updates (mini-batches x epochs) per step
    trainable: str = "lora"  # "lora" (same adapter as ESSA's SFT start) or "full"
    rank: int = 8
    switch_seconds: float = 5.0  # generation <-> training layout switch per step
    grad_bytes_per_param: float = 4.0  # gradients all-reduced in f32


def _check_gpus(num_gpus: int, workload: Workload) -> int:
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        raise ValueError(f"num_gpus={num_gpus!r} is invalid: valid values are integers >= 1")
    g = workload.gpus_per_replica
    if num_gpus % g:
        raise ValueError(
            f"num_gpus={num_gpus} is invalid: must be a multiple of gpus_per_replica={g}"
        )
    return num_gpus // g


def gen_tokens_per_s(model: ModelSpec, hw: Hardware, workload: Workload) -> float:
    """T_gen: the given throughput, else peak_flops x decode_mfu / flops_per_token."""
    if workload.gen_tokens_per_s is not None:
        if workload.gen_tokens_per_s <= 0:
            raise ValueError(
                f"gen_tokens_per_s={workload.gen_tokens_per_s} is invalid: valid values are > 0"
            )
        return float(workload.gen_tokens_per_s)
    return hw.peak_flops * hw.decode_mfu / model.flops_per_token


def generation_time(b: int, model: ModelSpec, hw: Hardware, workload: Workload) -> float:
    """t_gen(b): seconds for one replica to generate b rollouts (module docstring)."""
    if b <= 0:
        return 0.0
    g = workload.gpus_per_replica
    t_tok = 1.0 / (g * gen_tokens_per_s(model, hw, workload))
    t_mem = model.weight_bytes / (g * hw.hbm_bandwidth)
    l, p = workload.mean_completion_tokens, workload.prompt_tokens
    steps = max(workload.max_completion_tokens, math.ceil(b / workload.concurrent_rows) * l)
    return b * (p + l) * t_tok + steps * t_mem


def allgather_time(nbytes: float, n: int, hw: Hardware) -> float:
    """Ring all-gather of a value of `nbytes` over n devices (latency-bound for small values:
    a log-depth algorithm, 2 alpha log2 n)."""
    if n <= 1:
        return 0.0
    return (
        2 * hw.collective_latency * math.log2(n) + (n - 1) / n * nbytes / hw.interconnect_bandwidth
    )


def allreduce_time(nbytes: float, n: int, hw: Hardware) -> float:
    """Ring all-reduce: 2 (n-1) hops of latency alpha and 2 (n-1)/n x bytes per device."""
    if n <= 1:
        return 0.0
    return (
        2 * (n - 1) * hw.collective_latency + 2 * (n - 1) / n * nbytes / hw.interconnect_bandwidth
    )


def essa_generation_time(
    num_gpus: int,
    model: ModelSpec,
    essa: ESSASettings = ESSASettings(),
    hw: Hardware = Hardware(),
    workload: Workload = Workload(),
) -> dict[str, float]:
    """Seconds of one ESSA generation on `num_gpus` GPUs, by phase ("total" = sum)."""
    r = _check_gpus(num_gpus, workload)
    b = math.ceil(essa.population_size * essa.prompts_per_candidate / r)
    d = model.essa_genome_dims(essa.rank, essa.num_targets)
    p = essa.population_size
    phases = {
        "rollout": generation_time(b, model, hw, workload),
        "fitness_allgather": allgather_time(p * essa.fitness_bytes, num_gpus, hw),
        "es_update": (2.0 * p * d * d + 10.0 * d**3) / hw.host_flops,
    }
    phases["total"] = sum(phases.values())
    return phases


def grpo_trainable_params(model: ModelSpec, grpo: GRPOSettings) -> float:
    if grpo.trainable == "lora":
        return float(model.lora_params(grpo.rank))
    if grpo.trainable == "full":
        return float(model.n_params)
    raise ValueError(f"trainable={grpo.trainable!r} is invalid: valid values are 'lora', 'full'")


def grpo_step_time(
    num_gpus: int,
    model: ModelSpec,
    grpo: GRPOSettings = GRPOSettings(),
    hw: Hardware = Hardware(),
    workload: Workload = Workload(),
) -> dict[str, float]:
    """Seconds of one GRPO step on `num_gpus` GPUs, by phase ("total" = sum)."""
    r = _check_gpus(num_gpus, workload)
    rollouts = grpo.prompts_per_step * grpo.group_size
    tokens = rollouts * (workload.prompt_tokens + workload.mean_completion_tokens)
    train_flops_per_token = (4.0 if grpo.trainable == "lora" else 6.0) * model.n_params
    cluster_flops = num_gpus * hw.peak_flops * hw.train_mfu
    n_train = grpo_trainable_params(model, grpo)
    phases = {
        "rollout": generation_time(math.ceil(rollouts / r), model, hw, workload),
        "old_logprobs": tokens * model.flops_per_token / cluster_flops,
        "forward_backward": tokens * train_flops_per_token / cluster_flops,
        "grad_allreduce": grpo.updates_per_step
        * allreduce_time(n_train * grpo.grad_bytes_per_param, num_gpus, hw),
        "weight_sync": n_train * model.bytes_per_param / hw.interconnect_bandwidth
        if num_gpus > 1
        else 0.0,
        "switch": grpo.switch_seconds,
    }
    phases["total"] = sum(phases.values())
    return phases


@dataclasses.dataclass(frozen=True)
class PaperReport:
    """Reported minutes to the target accuracy (ESSA Sec. 5, Qwen2.5-32B, PRM800K, acc 0.835)."""

    model: str = "Qwen2.5-32B"
    target: str = "PRM800K accuracy 0.835"
    essa_minutes: dict = dataclasses.field(default_factory=lambda: {16: 200.0, 128: 20.0})
    grpo_minutes: dict = dataclasses.field(default_factory=lambda: {16: 400.0, 128: 150.0})
    reported_speedup: dict = dataclasses.field(default_factory=lambda: {16: 2.0, 128: 6.0})


def time_to_target(
    gpu_counts: tuple[int, ...],
    model: ModelSpec,
    *,
    essa: ESSASettings = ESSASettings(),
    grpo: GRPOSettings = GRPOSettings(),
    hw: Hardware = Hardware(),
    workload: Workload = Workload(),
    report: PaperReport = PaperReport(),
    calibrate_at: int = 16,
) -> dict[str, Any]:
    """Predicted minutes to the target and ESSA-vs-GRPO speedup for each GPU count.

    Step counts are calibrated at `calibrate_at` GPUs from `report` (module docstring); the
    result holds them with the per-step times, so the arithmetic can be checked.
    """
    if calibrate_at not in report.essa_minutes or calibrate_at not in report.grpo_minutes:
        raise ValueError(
            f"calibrate_at={calibrate_at} is invalid: valid values are the GPU counts the report "
            f"has for both methods: {sorted(set(report.essa_minutes) & set(report.grpo_minutes))}"
        )
    essa_steps = (
        60
        * report.essa_minutes[calibrate_at]
        / essa_generation_time(calibrate_at, model, essa, hw, workload)["total"]
    )
    grpo_steps = (
        60
        * report.grpo_minutes[calibrate_at]
        / grpo_step_time(calibrate_at, model, grpo, hw, workload)["total"]
    )
    rows = []
    for n in gpu_counts:
        te = essa_generation_time(n, model, essa, hw, workload)["total"]
        tg = grpo_step_time(n, model, grpo, hw, workload)["total"]
        rows.append(
            {
                "gpus": n,
                "essa_step_s": te,
                "grpo_step_s": tg,
                "essa_minutes": essa_steps * te / 60,
                "grpo_minutes": grpo_steps * tg / 60,
                "speedup": (grpo_steps * tg) / (essa_steps * te),
            }
        )
    return {"essa_steps": essa_steps, "grpo_steps": grpo_steps, "rows": rows}


def scaling_efficiency(step_time: dict[int, float]) -> dict[int, float]:
    """Parallel efficiency t(n0) n0 / (t(n) n) relative to the smallest GPU count n0."""
    n0 = min(step_time)
    return {n: step_time[n0] * n0 / (t * n) for n, t in step_time.items()}
