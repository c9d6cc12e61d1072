"""The ahead-of-time plan's report: each program's bytes and its estimated time on the target.

`essa_jax.plan` compiles a run's programs and accounts their per-device bytes (`ProgramPlan`);
this module turns a plan into what a person reads: one row per program with units on every column,
the estimated seconds of one call of each program, and the estimated seconds of one training step
(an ESSA generation, a GRPO step, an SFT step).

Time (`estimate_seconds`) is the cost model's (`essa_jax.scaling.costmodel`, where the formulas
and their sources are): a roofline of each phase, its FLOPs at the chip's dense bf16 peak against
its HBM bytes at the chip's bandwidth, plus the tensor-parallel all-reduces, from the published
figures of `costmodel.HARDWARE` (`--chip`). Its inputs are the compiled program's own (argument
bytes per device = the weights each decode step reads; rows, chunks and micro-batches as the plan
chose them) and the model's shape (FLOPs and KV-cache bytes per token). No efficiency factor: a
lower bound, the time a perfectly efficient implementation would take. Not counted: host reward
time, the ES tell, the gradient all-reduce of an update, compilation.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

GB = 1e9
# Programs whose call is generation (prefill + decode, `costmodel.generation_time`): the key of
# `ProgramPlan.chunks` holding the rows of one device, and the one holding its rows per chunk
# (None or 0: all rows at once).
GENERATION_ROWS = {
    "essa_population": ("rows_per_device", "essa.rows_per_chunk"),
    "grpo_rollout": ("rollout_rows_per_device", "grpo.rows_per_chunk"),
    "heldout_eval": ("eval.batch_size", None),
}
# Programs whose call is teacher-forced passes over a device's rows (`costmodel.update_time`):
# the key of their rows per device.
TRAINING_ROWS = {
    "sft_step": "sft.batch_size",  # the whole batch: divided over the data axis below
    "grpo_update": "minibatch_rows_per_device",
    "grpo_score": "score_rows_per_device",
}


def estimate_seconds(plan: Any, config: Any, mc: Any, chip: Any) -> float | None:
    """Seconds of one call of the planned program `plan` (a `plan.ProgramPlan`) on `chip` (a
    `costmodel.Chip`), by the cost model (module docstring); None for a program it has no model of
    or one refused before compiling. `config`: the run's config; `mc`: the model's shape."""
    from essa_jax.plan import model_flops
    from essa_jax.scaling import costmodel as cm
    from essa_jax.train.pipeline import model_dtype

    if plan.argument_bytes == 0:
        return None
    # The plan compiles for accelerators: "auto" is bfloat16 there.
    itemsize = np.dtype(model_dtype(config.model.dtype, "gpu")).itemsize
    model = cm.ModelCounts.from_config(mc, bytes_per_param=itemsize)
    g = int(plan.mesh.get("model", 1))
    prompt, new = int(config.task.max_prompt_tokens), int(config.generation.max_new_tokens)
    if plan.program in GENERATION_ROWS:
        rows_key, chunk_key = GENERATION_ROWS[plan.program]
        rows = int(plan.chunks[rows_key])
        chunk = int(plan.chunks.get(chunk_key) or rows) if chunk_key else rows
        prog = cm.GenerationProgram(
            model_devices=g,
            rows_per_chunk=chunk,
            prompt_tokens=prompt,
            new_tokens=new,
            weight_bytes_per_device=float(plan.argument_bytes),
        )
        return float(cm.generation_time(rows, prog, model, chip)["total"])
    if plan.program not in TRAINING_ROWS:
        return None
    rows = int(plan.chunks[TRAINING_ROWS[plan.program]])
    if plan.program == "sft_step":
        rows = -(-rows // int(plan.mesh.get("data", 1)))
    seq = int(plan.chunks["sequence"]) if "sequence" in plan.chunks else prompt + new
    remat = bool(config.model.remat)
    if plan.program == "grpo_score":
        # Forward passes over the rows (old and / or reference log-probs): the program's own count.
        passes = round(plan.model_flops * g / model_flops(mc, rows, seq))
        upd = cm.UpdateProgram(rows, seq, remat, grad_bytes=0.0, score_passes=passes)
        return float(cm.update_time(rows, upd, model, chip, g)["score"])
    micro = [v for k, v in plan.chunks.items() if k.endswith("micro_batch_size")]
    upd = cm.UpdateProgram(int(micro[0]) if micro else rows, seq, remat, grad_bytes=0.0)
    phases = cm.update_time(rows, upd, model, chip, g)
    return float(phases["update"] + phases["tp_allreduce"])


def step_seconds(plans: list[Any], config: Any) -> dict[str, float]:
    """Estimated seconds of one training step of each loop the plan covers, from its programs'
    `est_seconds`: {"sft step": sft_step, "ESSA generation": essa_population, "GRPO step":
    grpo_rollout + grpo_score + grpo_update x epochs x num_minibatches}; a loop with a program
    without an estimate is left out."""
    est = {p.program: p.est_seconds for p in plans}
    out = {}
    if est.get("sft_step") is not None:
        out["SFT step"] = est["sft_step"]
    if est.get("essa_population") is not None:
        out["ESSA generation"] = est["essa_population"]
    grpo = [est.get(n) for n in ("grpo_rollout", "grpo_update")]
    if all(t is not None for t in grpo) and ("grpo_score" not in est or est["grpo_score"]):
        updates = int(config.grpo.epochs) * int(config.grpo.num_minibatches)
        out["GRPO step"] = grpo[0] + est.get("grpo_score", 0.0) + grpo[1] * updates
    return out


def _seconds(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    return f"{s:.3g}" if s < 1000 else f"{s:.0f}"


def format_header() -> str:
    """The column names of `format_row`, each with its unit."""
    return (
        f"{'program':<16} {'mesh (axis=size)':<22} {'args GB':>9} {'temp GB':>9} {'out GB':>8} "
        f"{'total GB':>10} {'of GB':>7} {'fits':>5} {'TFLOP':>8} {'est s':>9}  "
        "chunks (rows)"
    )


def format_row(p: Any) -> str:
    """One program of the plan: per-device GB (decimal), whether it fits, its model TFLOP per call
    per device, its estimated seconds per call (`est_seconds`; "-" without one), its chunk sizes."""
    mesh = ",".join(f"{k}={v}" for k, v in p.mesh.items())
    chunks = ", ".join(f"{k}={v}" for k, v in p.chunks.items())
    return (
        f"{p.program:<16} {mesh:<22} {p.argument_bytes / GB:>9.2f} {p.temp_bytes / GB:>9.2f} "
        f"{p.output_bytes / GB:>8.2f} {p.per_device_bytes / GB:>10.2f} "
        f"{p.device_memory_bytes / GB:>7.1f} {'yes' if p.fits else 'NO':>5} "
        f"{p.model_flops / 1e12:>8.3g} {_seconds(p.est_seconds):>9}  {chunks}"
    )


def format_legend(chip: Any | None) -> str:
    """What the columns mean, and on which hardware figures the times are estimated."""
    on = (
        f"est s: estimated seconds per call on {chip.name} ({chip.peak_flops / 1e12:g} TFLOP/s, "
        f"{chip.hbm_bandwidth / 1e12:g} TB/s HBM; costmodel roofline, a lower bound)"
        if chip is not None
        else "est s: - (no hardware figures for this target; --chip names them for GPU targets)"
    )
    return (
        "GB: 1e9 bytes per device (args + temp + out - donated = total, of the device's GB); "
        f"TFLOP: model FLOPs per call per device; {on}"
    )


def format_steps(plans: list[Any], config: Any) -> str:
    """One line: the estimated seconds of each loop's step (`step_seconds`), '' if none."""
    steps = step_seconds(plans, config)
    if not steps:
        return ""
    return "estimated per step: " + "; ".join(f"{k} {_seconds(v)} s" for k, v in steps.items())


def failure_message(p: Any) -> str:
    """One line: which program does not fit, by how much, and what would make it fit."""
    budget = (1.0 - p.headroom) * p.device_memory_bytes
    if p.per_device_bytes == 0:  # refused before compiling; `fix` says why
        return f"{p.program} does not fit on {p.target}: {p.fix}"
    return (
        f"{p.program} does not fit: {p.per_device_bytes / GB:.1f} GB per device > "
        f"{budget / GB:.1f} GB ({1 - p.headroom:.0%} of {p.device_memory_bytes / GB:.1f} GB) "
        f"on {p.target}; try {p.fix}"
    )
