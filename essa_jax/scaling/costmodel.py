"""A first-principles cost model of an ESSA generation and a GRPO step on a GPU cluster.

Purpose: predict the time per step of our own programs at 8-128 GPUs from what they compute and
move, and set the prediction beside what the ESSA paper reports (arXiv 2507.04453, Sec. 5,
Qwen2.5-32B on PRM800K, time to 0.835 accuracy: about 2x faster than GRPO on 16 GPUs, about 6x on
128; GRPO 400 -> 150 min, ESSA 200 -> under 20 min). Nothing here is fitted to the paper: the
inputs are (1) counts taken from our compiled programs (`ProgramCounts`, filled by
benchmarks/scaling.py from the ahead-of-time plan, `essa_jax.plan`) and from the model's shape,
and (2) the published hardware figures of `HARDWARE`.

Model (every phase is a roofline: the larger of its FLOPs at the chip's peak and its HBM bytes at
the chip's bandwidth, plus its collectives; no efficiency factor, so every time is a lower bound
that both methods share):

*Generation* (`generation_time`; the population program and GRPO's rollout program are the same
decode loop). A replica of g = `model` devices holds b rows, run in ceil(b / c) chunks of c rows
(`rows_per_chunk`; the program pads b to a multiple of c). Per chunk:
- prefill of p prompt tokens: FLOPs c (F_dense p + F_attn p (p + 1) / 2) / g; bytes: the device's
  weights W once + the chunk's KV cache written;
- n decode steps (the program's `max_new_tokens`: rows stop early only when every row of the
  chunk has, so the longest completion sets the steps): step s reads W and the KV cache of
  p + s + 1 positions of c rows, and computes c (F_dense + F_attn (p + s + 1)) / g;
- tensor parallelism: 2 all-reduces of [rows, d] per layer per forward pass (after attention and
  after the MLP; docs/ARCHITECTURE.md, Tensor parallelism), over NVLink.
F_dense = 2 x (kernel + head parameters), F_attn = 4 L H hd per key (`essa_jax.plan.model_flops`,
the shape count: XLA's cost analysis counts a loop body once, so its FLOPs and bytes of a program
with a layer scan and a decode loop are lower bounds, recorded beside ours, never used).

*ESSA generation* (`essa_generation_time`): P members x B prompts over R = G / g replicas (the pop
axis pads P to a multiple of R: ceil(P / R) members per replica, B rows each), then across
processes (one per node of 8 GPUs) the all-gather of 16 bytes per row (reward, length, finished,
owned: `population.evaluator`), and the CMA-ES tell that every process repeats: sampling 2 P D^2
and the deferred rank-mu matmul 2 (mu + 1) D^2 FLOPs per generation plus the eigendecomposition,
~4 D^3 FLOPs every `eigen_interval` generations (`essa_jax.es.cma_es`), at `es_flops`.

*GRPO step* (`grpo_step_time`; our data-parallel trainer, docs/ARCHITECTURE.md): Q N rollouts over
R replicas (ceil(Q N / R) each), the per-row reward gather (16 bytes per row), old / reference
log-probs when the config needs them (a forward over the rows), the update (the forward, the
backward's input gradients, a second forward with remat: `model_flops(train=True)`) over the
device's rows with its micro-batches (each micro-batch reads the weights 2-3 times), the psum of
the trainable gradient across the R data groups (its bytes counted in the compiled update
program's HLO), and TP all-reduces of the training activations. No weight sync and no layout
switch: our rollout and update run in one process on the same weights.

Not modelled: host reward time (the same for both), evaluation, stragglers, overlap of phases,
kernel launch overheads, and the number of steps to a target (`compare_with_paper` explains why
the paper's speedup is a ratio of time-to-target, not of step time).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

# ---------------------------------------------------------------------------------------------
# published hardware figures (one table, with the source of every number)


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator and its links. Bandwidths in bytes/s each way; latencies in seconds per
    collective step."""

    name: str
    peak_flops: float  # dense bf16
    hbm_bandwidth: float
    memory_bytes: float
    intra_node_bandwidth: float  # NVLink, per GPU, one direction
    inter_node_bandwidth: float  # InfiniBand, per GPU, one direction
    gpus_per_node: int
    intra_node_latency: float
    inter_node_latency: float
    source: str


# The NVLink / NDR figures are per GPU: 900 GB/s is NVLink 4's total of both directions (18 links x
# 50 GB/s), 450 GB/s each way; one ConnectX-7 NDR port per GPU is 400 Gb/s = 50 GB/s each way.
# Latencies are not datasheet figures: a few microseconds per NCCL step is the order nccl-tests
# shows for small messages; they matter only for the per-layer TP all-reduces of decoding.
HARDWARE: dict[str, Chip] = {
    "H100-SXM": Chip(
        name="H100-SXM",
        peak_flops=989e12,
        hbm_bandwidth=3.35e12,
        memory_bytes=80e9,
        intra_node_bandwidth=450e9,
        inter_node_bandwidth=50e9,
        gpus_per_node=8,
        intra_node_latency=5e-6,
        inter_node_latency=10e-6,
        source=(
            "NVIDIA H100 Tensor Core GPU datasheet (SXM5): 989 TFLOP/s dense BF16 (1,979 with "
            "sparsity), 3.35 TB/s HBM3, 80 GB, NVLink 900 GB/s (both directions); NVIDIA "
            "ConnectX-7: InfiniBand NDR 400 Gb/s per port, one per GPU in a DGX H100"
        ),
    ),
    "H200-SXM": Chip(
        name="H200-SXM",
        peak_flops=989e12,
        hbm_bandwidth=4.8e12,
        memory_bytes=141e9,
        intra_node_bandwidth=450e9,
        inter_node_bandwidth=50e9,
        gpus_per_node=8,
        intra_node_latency=5e-6,
        inter_node_latency=10e-6,
        source="NVIDIA H200 datasheet (SXM): 989 TFLOP/s dense BF16, 4.8 TB/s HBM3e, 141 GB",
    ),
}


# ---------------------------------------------------------------------------------------------
# what the programs compute and move (counted from the model's shape and our compiled programs)


@dataclasses.dataclass(frozen=True)
class ModelCounts:
    """Per-token counts of a decoder from its shape (`from_config`).

    dense_flops: 2 x (projection kernels + output head) per token; attn_flops_per_key:
    4 L H hd (scores and values) per attended key; kv_bytes_per_token: L x 2 x kv_heads x hd x
    bytes of the cache; weight_bytes: every parameter at `bytes_per_param`."""

    name: str
    num_layers: int
    hidden_size: int
    dense_flops: float
    attn_flops_per_key: float
    kv_bytes_per_token: float
    weight_bytes: float
    activation_bytes: int = 2  # bf16

    @classmethod
    def from_config(cls, mc: Any, name: str = "", bytes_per_param: int = 2) -> ModelCounts:
        """From an `essa_jax.models.ModelConfig` (the same formula as `plan.model_flops`)."""
        kernels = sum(i * o for i, o in mc.projection_shapes().values())
        return cls(
            name=name,
            num_layers=mc.num_layers,
            hidden_size=mc.hidden_size,
            dense_flops=2.0 * (mc.num_layers * kernels + mc.hidden_size * mc.vocab_size),
            attn_flops_per_key=4.0 * mc.num_layers * mc.num_heads * mc.head_dim,
            kv_bytes_per_token=float(
                mc.num_layers * 2 * mc.num_kv_heads * mc.head_dim * bytes_per_param
            ),
            weight_bytes=float(mc.num_params() * bytes_per_param),
            activation_bytes=bytes_per_param,
        )


@dataclasses.dataclass(frozen=True)
class GenerationProgram:
    """A compiled generation program (ESSA population or GRPO rollout), per replica.

    model_devices: g (the mesh's model axis); rows_per_chunk: c (the plan's choice);
    prompt_tokens, new_tokens: p, n; weight_bytes_per_device: the compiled program's argument
    bytes (weights' shard + SVD basis + inputs; `memory_analysis`); tp_bytes_per_row_layer: bytes
    all-reduced per row per layer per forward token, from the program's HLO when g > 1 (0 on
    one device); xla_flops, xla_bytes: XLA's cost analysis (lower bounds: loop bodies once)."""

    model_devices: int
    rows_per_chunk: int
    prompt_tokens: int
    new_tokens: int
    weight_bytes_per_device: float
    tp_bytes_per_row_layer: float = 0.0
    xla_flops: float = 0.0
    xla_bytes: float = 0.0


@dataclasses.dataclass(frozen=True)
class UpdateProgram:
    """A compiled GRPO update (and scoring) program, per device.

    micro_batch_rows: rows per micro-batch; sequence: p + n; remat: a second forward;
    grad_bytes: bytes of the gradient psum across data groups (the HLO all-reduce payload of
    the compiled update, outside every loop: exact); score_passes: forward passes over the rows
    for old / reference log-probs (0 when the config needs neither).

    Full-parameter training with ZeRO-3 / FSDP over data (`lora.full`, docs/ARCHITECTURE.md,
    "Full-parameter training"): grad_bytes 0; rollout_gather_bytes: the bf16 weights the rollout
    all-gathers over data on entry, the re-shard into the generation layout (the HLO all-gather
    payload of the compiled rollout), which each scoring pass gathers too, a layer at a time;
    weight_gather_bytes: the update's all-gathers, each layer's bf16 weights forward and again
    backward, per micro-batch (the HLO all-gather payloads times their trip counts);
    grad_scatter_bytes: the float32 gradient reduce-scattered over data per layer and
    micro-batch (the HLO reduce-scatter payloads times their trip counts);
    compiled_micro_batches: the micro-batches per device of the compiled program those two
    byte counts come from (0: the same as at every GPU count modelled), so that on G GPUs they
    scale with that count's micro-batches per device (each gathers and scatters every layer)."""

    micro_batch_rows: int
    sequence: int
    remat: bool
    grad_bytes: float
    score_passes: int = 0
    xla_flops: float = 0.0
    weight_gather_bytes: float = 0.0
    grad_scatter_bytes: float = 0.0
    rollout_gather_bytes: float = 0.0
    compiled_micro_batches: int = 0


# ---------------------------------------------------------------------------------------------
# collectives (bandwidth-optimal ring algorithms; Patarasuk & Yuan 2009, NCCL's bus bandwidth)


def _link(n_devices: int, chip: Chip, span: int | None = None) -> tuple[float, float]:
    """(bandwidth, latency) of a collective over n devices: NVLink within a node, InfiniBand
    (the slowest link of the ring) once it spans nodes. `span`: the GPUs the ring's members lie
    across when that is more than n (a data-axis ring over n replicas of `model` devices each
    spans n x model GPUs)."""
    if (span or n_devices) <= chip.gpus_per_node:
        return chip.intra_node_bandwidth, chip.intra_node_latency
    return chip.inter_node_bandwidth, chip.inter_node_latency


def allreduce_time(
    nbytes: float, n: int, chip: Chip, bandwidth: float | None = None, span: int | None = None
) -> float:
    """Ring all-reduce of `nbytes`: 2 (n - 1) steps, each device sends 2 (n - 1) / n x bytes
    (`span`: as `_link`)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    bw, lat = _link(n, chip, span)
    bw = bandwidth or bw
    return 2 * (n - 1) * lat + 2 * (n - 1) / n * nbytes / bw


def allgather_time(nbytes: float, n: int, chip: Chip, span: int | None = None) -> float:
    """Ring all-gather of a value of `nbytes` in total: n - 1 steps, (n - 1) / n x bytes each.
    A ring reduce-scatter of `nbytes` (the summed value) moves the same bytes in as many steps
    (`span`: as `_link`)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    bw, lat = _link(n, chip, span)
    return (n - 1) * lat + (n - 1) / n * nbytes / bw


# ---------------------------------------------------------------------------------------------
# phases


def generation_time(
    rows: int, prog: GenerationProgram, model: ModelCounts, chip: Chip
) -> dict[str, float]:
    """Seconds for one replica to generate `rows` rows with `prog` (module docstring).

    -> {"prefill", "decode", "tp_allreduce", "total", "chunks", "decode_memory_bound_share"}."""
    if rows <= 0:
        return {"prefill": 0.0, "decode": 0.0, "tp_allreduce": 0.0, "total": 0.0, "chunks": 0}
    g, p, n = prog.model_devices, prog.prompt_tokens, prog.new_tokens
    c = min(rows, prog.rows_per_chunk)
    chunks = math.ceil(rows / c)
    w = prog.weight_bytes_per_device
    kv = model.kv_bytes_per_token / g
    pre_flops = c * (model.dense_flops * p + model.attn_flops_per_key * p * (p + 1) / 2) / g
    pre_bytes = w + c * p * kv
    prefill = max(pre_flops / chip.peak_flops, pre_bytes / chip.hbm_bandwidth)
    ctx = p + 1 + np.arange(n, dtype=np.float64)  # keys attended at each decode step
    step_flops = c * (model.dense_flops + model.attn_flops_per_key * ctx) / g
    step_bytes = w + c * ctx * kv
    t_compute, t_memory = step_flops / chip.peak_flops, step_bytes / chip.hbm_bandwidth
    decode = float(np.sum(np.maximum(t_compute, t_memory)))
    # 2 all-reduces per layer per forward pass, of [rows, d] activations (prefill: c x p rows)
    per_row = prog.tp_bytes_per_row_layer or (2.0 * model.hidden_size * model.activation_bytes)
    tp = 0.0
    if g > 1:
        ops = 2 * model.num_layers
        op_prefill = allreduce_time(c * p * per_row / 2, g, chip)
        op_step = allreduce_time(c * per_row / 2, g, chip)
        tp = ops * (op_prefill + n * op_step)
    one = prefill + decode + tp
    return {
        "prefill": chunks * prefill,
        "decode": chunks * decode,
        "tp_allreduce": chunks * tp,
        "total": chunks * one,
        "chunks": chunks,
        "decode_memory_bound_share": float(np.mean(t_memory >= t_compute)),
    }


@dataclasses.dataclass(frozen=True)
class ESSASettings:
    """ESSA's per-generation sizes: population P, prompts per member B, genome length D, CMA-ES
    parents mu and eigen interval (`essa_jax.es.CMAES` defaults for P, D), `es_flops`: the FLOP
    rate of the host running the tell (LAPACK eigh on a CPU; a measured figure, see
    experiments/results/strategies.json)."""

    population_size: int = 96
    prompts_per_candidate: int = 100
    genome_dims: int = 4096
    num_parents: int = 48
    eigen_interval: int = 9
    es_flops: float = 1e11
    gather_bytes_per_row: int = 16


def essa_generation_time(
    num_gpus: int,
    prog: GenerationProgram,
    model: ModelCounts,
    essa: ESSASettings,
    chip: Chip,
) -> dict[str, float]:
    """Seconds of one ESSA generation on `num_gpus` GPUs, by phase ("total" = their sum)."""
    r = _replicas(num_gpus, prog.model_devices)
    members = math.ceil(essa.population_size / r)  # the pop axis pads P to a multiple of R
    rows = members * essa.prompts_per_candidate
    gen = generation_time(rows, prog, model, chip)
    processes = math.ceil(num_gpus / chip.gpus_per_node)
    total_rows = essa.population_size * essa.prompts_per_candidate
    d, p = essa.genome_dims, essa.population_size
    es_flops = 2 * p * d * d + 2 * (essa.num_parents + 1) * d * d + 4 * d**3 / essa.eigen_interval
    phases = {
        "rollout": gen["total"],
        "row_gather": allgather_time(essa.gather_bytes_per_row * total_rows, processes, chip),
        "es_tell": es_flops / essa.es_flops,
    }
    phases["total"] = sum(phases.values())
    phases["rows_per_replica"] = rows
    phases["gather_bytes"] = essa.gather_bytes_per_row * total_rows
    return phases


@dataclasses.dataclass(frozen=True)
class GRPOSettings:
    """GRPO's per-step sizes: Q prompts x N rollouts (our F-GRPO config: 64 x 8)."""

    prompts_per_step: int = 64
    group_size: int = 8
    gather_bytes_per_row: int = 16


def update_time(
    rows: int, upd: UpdateProgram, model: ModelCounts, chip: Chip, g: int
) -> dict[str, float]:
    """Seconds of the update (and scoring) over one device's `rows` (g: model axis)."""
    if rows <= 0:
        return {"score": 0.0, "update": 0.0, "tp_allreduce": 0.0}
    s = upd.sequence
    fwd = rows * (model.dense_flops * s + model.attn_flops_per_key * s * (s + 1) / 2) / g
    passes = 3 if upd.remat else 2  # forward + input gradients (+ the remat forward)
    micro = math.ceil(rows / max(1, upd.micro_batch_rows))
    w = model.weight_bytes / g
    update = max(passes * fwd / chip.peak_flops, micro * passes * w / chip.hbm_bandwidth)
    score = upd.score_passes * max(fwd / chip.peak_flops, micro * w / chip.hbm_bandwidth)
    tp = 0.0
    if g > 1:  # 2 all-reduces per layer per pass over the activations, forward and backward
        act = rows * s * model.hidden_size * model.activation_bytes
        ops = (passes + upd.score_passes) * 2 * model.num_layers
        tp = micro * ops * allreduce_time(act / micro, g, chip)
    return {"score": score, "update": update, "tp_allreduce": tp}


def grpo_step_time(
    num_gpus: int,
    rollout: GenerationProgram,
    upd: UpdateProgram,
    model: ModelCounts,
    grpo: GRPOSettings,
    chip: Chip,
) -> dict[str, float]:
    """Seconds of one GRPO step on `num_gpus` GPUs, by phase ("total" = their sum)."""
    g = rollout.model_devices
    r = _replicas(num_gpus, g)
    total_rows = grpo.prompts_per_step * grpo.group_size
    rows = math.ceil(total_rows / r)  # rows padded to the data axis
    gen = generation_time(rows, rollout, model, chip)
    upd_t = update_time(rows, upd, model, chip, g)
    processes = math.ceil(num_gpus / chip.gpus_per_node)
    # The update's FSDP bytes were counted in a program of `compiled_micro_batches` micro-batches
    # per device; here each device runs `micro` of them, each gathering and scattering every layer.
    micro = math.ceil(rows / max(1, upd.micro_batch_rows))
    per_micro = micro / upd.compiled_micro_batches if upd.compiled_micro_batches else 1.0
    span = r * g  # a data-axis ring over r replicas spans r x g GPUs
    phases = {
        "rollout": gen["total"],
        "row_gather": allgather_time(grpo.gather_bytes_per_row * total_rows, processes, chip),
        "score": upd_t["score"],
        "update": upd_t["update"] + upd_t["tp_allreduce"],
        "grad_allreduce": allreduce_time(upd.grad_bytes, r, chip, span=span),
        # FSDP (full-parameter): the bf16 weights gathered whole by the rollout and by each
        # scoring pass (a layer at a time), and per micro-batch, forward and backward, by the
        # update; the gradient reduce-scattered (a ring reduce-scatter = an all-gather's bytes;
        # latency counted once per program, the layers' and micro-batches' payloads summed).
        "weight_allgather": (1 + upd.score_passes)
        * allgather_time(upd.rollout_gather_bytes, r, chip, span=span)
        + allgather_time(per_micro * upd.weight_gather_bytes, r, chip, span=span),
        "grad_reducescatter": allgather_time(
            per_micro * upd.grad_scatter_bytes, r, chip, span=span
        ),
    }
    phases["total"] = sum(phases.values())
    phases["rows_per_replica"] = rows
    return phases


def _replicas(num_gpus: int, g: int) -> int:
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        raise ValueError(f"num_gpus={num_gpus!r} is invalid: valid values are integers >= 1")
    if num_gpus % g:
        raise ValueError(f"num_gpus={num_gpus} is invalid: must be a multiple of model={g}")
    return num_gpus // g


# ---------------------------------------------------------------------------------------------
# against the paper


@dataclasses.dataclass(frozen=True)
class PaperReport:
    """Reported minutes to the target (ESSA Sec. 5, Qwen2.5-32B, PRM800K, accuracy 0.835)."""

    essa_minutes: dict = dataclasses.field(default_factory=lambda: {16: 200.0, 128: 20.0})
    grpo_minutes: dict = dataclasses.field(default_factory=lambda: {16: 400.0, 128: 150.0})


def compare_with_paper(
    essa_step_s: dict[int, float],
    grpo_step_s: dict[int, float],
    report: PaperReport = PaperReport(),
    small: int = 16,
    large: int = 128,
    step_ratio: float | None = None,
) -> dict[str, float]:
    """What per-step times can and cannot say about the paper's time-to-target speedups.

    The paper's speedup at G GPUs is (steps_GRPO t_GRPO(G)) / (steps_ESSA t_ESSA(G)). Step
    counts to a target are not a cost (the model has none), so the comparison that needs no
    fitted number is of how each method's time scales from `small` to `large` GPUs, at a
    fixed number of steps: predicted t(small) / t(large) against the reported minutes'
    ratio, and the growth of the speedup, [t_G(large) / t_G(small)] / [t_E(large) / t_E(small)]
    (the paper: 6 / 2 = 3). `implied_step_ratio` is the steps_GRPO / steps_ESSA that the
    paper's `small`-GPU minutes and our step times imply (an output, fed back into nothing).

    `step_ratio` (steps_GRPO / steps_ESSA to the target, from outside the model: e.g. the run
    lengths of the paper-scale configs, or a measured time-to-target) adds the predicted
    speedups themselves, step_ratio x t_GRPO(G) / t_ESSA(G) at `small` and `large`; their ratio
    is `predicted_speedup_growth` whatever step_ratio is."""
    e_small, e_large = essa_step_s[small], essa_step_s[large]
    g_small, g_large = grpo_step_s[small], grpo_step_s[large]
    rep_e = report.essa_minutes[small] / report.essa_minutes[large]
    rep_g = report.grpo_minutes[small] / report.grpo_minutes[large]
    pred_growth = (g_large / g_small) / (e_large / e_small)
    rep_speed_small = report.grpo_minutes[small] / report.essa_minutes[small]
    rep_speed_large = report.grpo_minutes[large] / report.essa_minutes[large]
    return {
        "predicted_essa_scaling": e_small / e_large,
        "reported_essa_scaling": rep_e,
        "predicted_grpo_scaling": g_small / g_large,
        "reported_grpo_scaling": rep_g,
        "linear_scaling": large / small,
        "predicted_speedup_growth": pred_growth,
        "reported_speedup_growth": rep_speed_large / rep_speed_small,
        "step_time_ratio_small": g_small / e_small,
        "step_time_ratio_large": g_large / e_large,
        "implied_step_ratio": rep_speed_small * e_small / g_small,
        "speedup_large_at_reported_small": rep_speed_small * pred_growth,
        **(
            {}
            if step_ratio is None
            else {
                "step_ratio": step_ratio,
                "predicted_speedup_small": step_ratio * g_small / e_small,
                "predicted_speedup_large": step_ratio * g_large / e_large,
            }
        ),
    }


def scaling_efficiency(step_time: dict[int, float]) -> dict[int, float]:
    """Parallel efficiency t(n0) n0 / (t(n) n) relative to the smallest GPU count n0."""
    n0 = min(step_time)
    return {n: step_time[n0] * n0 / (t * n) for n, t in step_time.items()}
