"""GRPO vs F-GRPO on SmolLM2-135M: does the focal weight keep pass@k at large k? (issue #21)

F-GRPO (arXiv 2602.06717) claims that GRPO sharpens the policy onto problems it already solves, so
pass@k at large k falls, and that scaling each prompt group's advantages by (1 - mu)^gamma keeps
pass@k while pass@1 stays. This script tests that on a task where the SFT start has a low pass@1
but a much higher pass@64, at group size 8, the same steps and seeds for every method.

Steps (each run is `python -m essa_jax.main` in its own workdir under OUT; a run whose
summary.json exists is not re-run, an interrupted one resumes from its last checkpoint, so the
script can be stopped and started again):

1. probe (`--probe`, or first when TASK=auto and the probe's JSON is missing): for every candidate
   task (PROBE_TASKS: sub_2d, arith_mixed, word_problems, add_2d), the SFT start's greedy pass@1
   on the 200 held-out problems and its pass@1..64 (64 samples at T = 1) on the first
   PROBE_PROBLEMS (50) of them -> experiments/results/compare_fgrpo_probe.json. Recommendation
   (`recommend`): among the candidates whose greedy pass@1 is <= 0.5 (room to improve pass@1),
   the largest headroom pass@64 - greedy pass@1 (the rare correct solutions GRPO could lose);
   ties to the lower pass@1. TASK=auto (default) runs on it; TASK=<name> overrides.
2. the runs, from ONE SFT start: `config.seed` = 0 for every run (same task data, same SFT
   adapter, same held-out problems, same pass@k sampling key: common random numbers), the seeds
   are `config.search_seed` (the training loop's sampling and prompt order). Methods (METHODS):
   sft (the start itself, its pass@k on the same problems), grpo, fgrpo (gamma 0.5), fgrpo_g1
   (gamma 1.0); optional dapo / fdapo (clip-higher 0.28) and cispo / fcispo (CISPO, eps 1.0 /
   5.0). Group size 8, batch 32 (4 prompts x 8 rollouts), STEPS (150) steps, greedy held-out
   accuracy every EVAL_EVERY (25) steps, then pass@k for k in 1, 4, 16, 64 from 64 samples at
   T = 1 on the 200 held-out problems with 95% bootstrap intervals over problems.
3. the report: experiments/results/compare_fgrpo.json (<method>_pass_at_<k> and _ci, steps, seeds,
   per-seed runs, paired differences F-variant - base with paired bootstrap intervals, and the
   per-step diagnostics: reward, all_right / all_wrong group fractions, mean token entropy) and
   compare_fgrpo.png (pass@k against k on a log axis per method; the diagnostics against step).

Time (2-core CPU, float32, one run at a time; constants in `COST`), measured by the first full
run (2026-12-04, Intel Xeon host, quiet; experiments/results/compare_fgrpo.json): one GRPO step at
group 8 / batch 32 / 5 new tokens is 6.0 s (902 s for 150 steps), so 150 steps = 15 min; a sampled
evaluation row (32-token prompt + 5 new tokens at eval batch 100) ~45 ms: pass@64 on 200 problems
= 12,800 rows = 9.5 min; on the probe's problems (PROBE_PROBLEMS, 50) ~2.5 min.
Memory of that evaluation
(`essa_jax.memory.generation_bytes_per_row`, float32): the existing batch path generates
`eval.batch_size` = 100 rows at a time, 4.1 MB per row (1.7 MB of it KV cache) = 0.41 GB per batch
on add_2d / sub_2d (0.54 GB arith_mixed, 0.68 GB word_problems), next to 0.54 GB of weights; the
12,800 completions are a few MB of host strings and the result keeps one count per problem. The
number of samples changes the time, not the peak: ~1-1.5 GB per run, far inside the 23 GB machine.
  probe (4 candidates, PROBE_PROBLEMS=50; measured)                      ~17 min
  sft  (load + SFT + pass@64; measured)                                  ~10 min
  grpo, fgrpo (each: load + SFT + 150 steps + 6 greedy evals + pass@64)  ~27 min each (measured)
  default plan (probe + sft grpo fgrpo, seed 0) on sub_2d               ~1.4 h (1 h 21 min)
  + fgrpo_g1 (METHODS="sft grpo fgrpo fgrpo_g1")                          +27 min
  + a second seed (SEEDS="0 1") of grpo and fgrpo                          +55 min
  + dapo fdapo cispo fcispo (one seed each)                                +1.8 h
On arith_mixed multiply the run times by ~1.3, on word_problems by ~2 (longer prompts, 16 new
tokens). `--dry_run` prints the plan, its commands and this estimate without running anything.

    experiments/compare_fgrpo.sh --probe                       # the probe only (~17 min)
    experiments/compare_fgrpo.sh                               # probe if missing, runs, report
    TASK=sub_2d METHODS="sft grpo fgrpo fgrpo_g1" experiments/compare_fgrpo.sh
    .venv/bin/python experiments/compare_fgrpo.py --report_only
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as a script: import essa_jax from this checkout

from essa_jax.evaluation import (  # noqa: E402
    bootstrap_ci,
    pass_at_k_per_problem,
    pass_at_k_values,
)

BASE_CONFIG = "experiments/configs/grpo_smollm2_arith.py"
RESULTS = "experiments/results/compare_fgrpo.json"
PROBE_RESULTS = "experiments/results/compare_fgrpo_probe.json"

# Candidate tasks -> config overrides on BASE_CONFIG (SmolLM2-135M-Instruct, LoRA r4 q/k/v/o, the
# 2-step SFT of essa_smollm2_arith.py). max_new_tokens = the longest answer + EOS + 1 spare, so a
# sample that does not stop shows as truncated (grpo_smollm2_arith.py). word_problems has no
# "A + B = " prefill: chat format (empty system turn), the "math" reward (boxed / last number;
# SFT teaches "The final answer is \boxed{N}.": 13 tokens with EOS), longer prompts (56 tokens).
TASKS: dict[str, dict[str, Any]] = {
    "sub_2d": {
        "task.name": "sub_2d",
        "task.prompt_format": "prefill",
        "generation.max_new_tokens": 5,
    },
    "arith_mixed": {
        "task.name": "arith_mixed",
        "task.prompt_format": "prefill",
        "generation.max_new_tokens": 6,  # answers up to 4 characters ("-123", "1728")
    },
    "word_problems": {
        "task.name": "word_problems",
        "task.prompt_format": "chat",
        "task.max_prompt_tokens": 96,
        "generation.max_new_tokens": 16,
    },
    "add_2d": {
        "task.name": "add_2d",
        "task.prompt_format": "prefill",
        "generation.max_new_tokens": 5,
    },
}

# Methods -> overrides. The F-variants are their base with the focal weight (1 - mu)^gamma on the
# advantages (method "fgrpo" = weighting "focal"); DAPO = the "grpo" loss with clip-higher
# eps_high 0.28 and token-mean aggregation (BASE_CONFIG's), without dynamic sampling or overlong
# shaping; CISPO = the clipped, detached IS weight with the F-GRPO paper's eps 1.0 / 5.0.
METHODS: dict[str, dict[str, Any]] = {
    "sft": {"method": "sft"},
    "grpo": {"method": "grpo", "grpo.focal_gamma": 0.0},
    "fgrpo": {"method": "fgrpo", "grpo.focal_gamma": 0.5},
    "fgrpo_g1": {"method": "fgrpo", "grpo.focal_gamma": 1.0},
    "dapo": {"method": "grpo", "grpo.focal_gamma": 0.0, "grpo.eps_high": 0.28},
    "fdapo": {"method": "fgrpo", "grpo.focal_gamma": 0.5, "grpo.eps_high": 0.28},
    "cispo": {
        "method": "grpo",
        "grpo.focal_gamma": 0.0,
        "grpo.loss": "cispo",
        "grpo.eps_low": 1.0,
        "grpo.eps_high": 5.0,
    },
    "fcispo": {
        "method": "fgrpo",
        "grpo.focal_gamma": 0.5,
        "grpo.loss": "cispo",
        "grpo.eps_low": 1.0,
        "grpo.eps_high": 5.0,
    },
}
# F-variant -> the base it is compared with, problem by problem.
PAIRS = {"fgrpo": "grpo", "fgrpo_g1": "grpo", "fdapo": "dapo", "fcispo": "cispo"}

# The time model of the module docstring: seconds per GRPO step and per sampled evaluation row,
# per task (sub_2d measured, add_2d the same shapes; the others scaled by prompt + new tokens as
# the probe's rows were), and per run's fixed part.
COST = {
    "step_s": {"add_2d": 6.0, "sub_2d": 6.0, "arith_mixed": 8.0, "word_problems": 12.8},
    "row_s": {"add_2d": 0.045, "sub_2d": 0.045, "arith_mixed": 0.062, "word_problems": 0.093},
    "fixed_s": 40.0,  # load, compile, 2 SFT steps, the SFT start's greedy evaluation
    "greedy_eval_s": 20.0,  # 200 held-out problems, greedy
}

Runner = Callable[[str, dict[str, Any], str], None]


# ----------------------------------------------------------------------------- plan


def pass_ks(samples: int) -> tuple[int, ...]:
    """k = 1, 4, 16, ... <= samples (and samples itself): (1, 4, 16, 64) for 64 samples."""
    ks, k = [], 1
    while k <= samples:
        ks.append(k)
        k *= 4
    if ks[-1] != samples:
        ks.append(samples)
    return tuple(ks)


def run_overrides(
    task: str,
    method: str,
    seed: int,
    *,
    steps: int,
    eval_every: int,
    samples: int,
    problems: int,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """The config overrides of one run on BASE_CONFIG. `config.seed` stays 0 for every run (one
    SFT start, one held-out set, one pass@k sampling key); `seed` is the loop's search_seed."""
    if task not in TASKS:
        raise SystemExit(f"unknown task {task!r}; valid: {' '.join(TASKS)}")
    if method not in METHODS:
        raise SystemExit(f"unknown method {method!r}; valid: {' '.join(METHODS)}")
    return {
        **TASKS[task],
        **METHODS[method],
        "seed": 0,
        "search_seed": seed,
        "task.num_heldout": 200,
        "max_wall_seconds": 0.0,  # the budget is steps: equal for every method
        "grpo.steps": steps,
        "grpo.group_size": 8,
        "grpo.batch_size": 32,  # 4 prompts x 8 rollouts per step
        "eval.every": eval_every,
        "eval.base_model": False,
        "eval.pass_k_samples": samples,
        "eval.pass_k": pass_ks(samples),
        "eval.pass_k_problems": problems,
        "checkpoint.every": 10,  # a stopped run loses at most 10 steps
        **extra,
    }


def probe_overrides(task: str, *, samples: int, problems: int, extra: Mapping[str, Any]) -> dict:
    """The SFT start of `task` only: greedy pass@1 on the held-out set, pass@k on `problems`."""
    return run_overrides(
        task,
        "sft",
        0,
        steps=1,
        eval_every=0,
        samples=samples,
        problems=problems,
        extra=extra,
    )


def workdir(out: str, task: str, method: str, seed: int) -> str:
    # The SFT start does not depend on the loop seed: one run serves every seed.
    return os.path.join(
        out, task, "sft" if method == "sft" else os.path.join(method, f"seed{seed}")
    )


def estimate_seconds(
    task: str,
    methods: Sequence[str],
    seeds: Sequence[int],
    steps: int,
    eval_every: int,
    samples: int,
    problems: int,
    probe: bool,
    probe_tasks: Sequence[str],
    probe_problems: int,
    row_s: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Wall-clock estimate of a plan from `COST` (or measured `row_s` from the probe)."""
    rows = {**COST["row_s"], **(row_s or {})}
    fixed, greedy = COST["fixed_s"], COST["greedy_eval_s"]
    est = {}
    if probe:
        est["probe"] = sum(fixed + samples * probe_problems * rows[t] for t in probe_tasks)
    scale = rows[task] / COST["row_s"]["add_2d"]
    for m in methods:
        n = 1 if m == "sft" else len(seeds)
        one = fixed + samples * problems * rows[task]
        if m != "sft":
            evals = steps // eval_every if eval_every else 0
            one += steps * COST["step_s"][task] + evals * greedy * scale
        est[m] = n * one
    est["total"] = sum(est.values())
    return est


# ----------------------------------------------------------------------------- running


def _flag(value: Any) -> str:
    """A value as ml_collections' `--config.<field>=` parses it."""
    if isinstance(value, tuple):
        return "(" + ", ".join(_flag(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)


def command(
    python: str, overrides: Mapping[str, Any], wd: str, config_path: str = BASE_CONFIG
) -> list[str]:
    cmd = [python, "-m", "essa_jax.main", "--config", config_path, "--workdir", wd]
    return cmd + [f"--config.{k}={_flag(v)}" for k, v in overrides.items()]


def subprocess_runner(python: str) -> Runner:
    """Each run in its own `python -m essa_jax.main` (fresh memory; resumes from its checkpoint),
    its output appended to <workdir>/log.txt."""

    def run(config_path: str, overrides: dict[str, Any], wd: str) -> None:
        cmd = command(python, overrides, wd, config_path)
        with open(os.path.join(wd, "log.txt"), "a") as log:
            rc = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        if rc:
            raise SystemExit(f"run failed (exit {rc}); see {wd}/log.txt")

    return run


def apply_overrides(config: Any, overrides: Mapping[str, Any]) -> Any:
    """`config` (a ConfigDict) with `overrides` {"a.b": value} set in place, as the command line
    would set them (the same fields, the same values)."""
    for key, value in overrides.items():
        node, *path = [config, *key.split(".")]
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    return config


def inprocess_runner(config_path: str, overrides: dict[str, Any], wd: str) -> None:
    """A run in this process (`train_and_evaluate`): the tests' runner (no new interpreter)."""
    from essa_jax.config import load_config_file
    from essa_jax.train import train_and_evaluate

    config = apply_overrides(load_config_file(os.path.join(ROOT, config_path)), overrides)
    train_and_evaluate(config, wd, verbose=False)


def ensure_run(
    runner: Runner,
    overrides: dict[str, Any],
    wd: str,
    label: str,
    config_path: str = BASE_CONFIG,
) -> bool:
    """Run unless finished (summary.json); resume when interrupted. Refuses a workdir started
    with other settings (a changed STEPS or task would otherwise mix two plans in one run).
    Returns True when it ran."""
    if os.path.exists(os.path.join(wd, "summary.json")):
        return False
    os.makedirs(wd, exist_ok=True)
    plan_path = os.path.join(wd, "compare_overrides.json")
    plan = json.loads(json.dumps(overrides))  # tuples as lists, as they come back from disk
    if os.path.exists(plan_path):
        with open(plan_path) as f:
            old = json.load(f)
        if old != plan:
            changed = sorted(k for k in set(old) | set(plan) if old.get(k) != plan.get(k))
            raise SystemExit(
                f"{wd} was started with other settings ({', '.join(changed)}); move it away or "
                "use another OUT"
            )
    else:
        with open(plan_path, "w") as f:
            json.dump(plan, f, indent=1)
    print(f"[{time.strftime('%H:%M:%S')}] {label} -> {wd}", flush=True)
    t0 = time.time()
    runner(config_path, overrides, wd)
    # The finishing invocation's wall-clock, all included (an interrupted part is not counted).
    with open(os.path.join(wd, "run_wall_seconds.json"), "w") as f:
        json.dump({"run_wall_seconds": time.time() - t0}, f)
    return True


def sync_records(
    src: str,
    dst: str,
    files: Sequence[str],
    done: str = "summary.json",
    complete: Callable[[str], bool] = lambda wd: True,
) -> list[str]:
    """Copy `files` of every finished run (a directory holding `done`, and `complete(directory)`)
    under `src` to the same relative directory under `dst`, where `dst` does not hold that
    finished run yet (a run finishes once: one finished in both is left alone). Returns the
    relative directories copied, sorted. An experiment uses it both ways: its OUT -> an archive
    committed with the results as runs finish, the archive -> a new session's OUT before planning,
    so a session's end loses only the runs in flight. `done` is copied last: a copy cut short
    leaves an unfinished run, never a partial record. `complete` is for records a manager writes
    after the run's own `done` (compare_methods: the segment of run_record.json): another manager
    sharing OUT would otherwise archive the run in between, once and for all, without it."""
    import shutil

    copied = []
    for dirpath, _, present in os.walk(src):
        if done not in present or not complete(dirpath):
            continue
        rel = os.path.relpath(dirpath, src)
        target = os.path.join(dst, rel)
        if os.path.exists(os.path.join(target, done)):
            continue
        os.makedirs(target, exist_ok=True)
        for name in [f for f in files if f != done and f in present] + [done]:
            shutil.copy2(os.path.join(dirpath, name), os.path.join(target, name))
        copied.append(rel)
    return sorted(copied)


def _load(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


# ----------------------------------------------------------------------------- probe


def _sft_solved(wd: str) -> str:
    """The "0"/"1" string of the SFT start's greedy held-out evaluation (metrics.jsonl, step 0)."""
    from essa_jax.train.metrics import read_metrics

    rows = [r for r in read_metrics(wd) if r["phase"] == "eval" and r["step"] == 0]
    if not rows or not rows[-1].get("solved"):
        raise SystemExit(f"{wd}/metrics.jsonl has no greedy evaluation of the SFT start")
    return rows[-1]["solved"]


def recommend(candidates: Mapping[str, Mapping[str, Any]], max_start: float = 0.5) -> str:
    """The task with the largest headroom pass@64 - greedy pass@1 among those whose greedy pass@1
    is <= max_start (all of them if none is); ties to the lower greedy pass@1.

    Why: F-GRPO's effect lives in the problems the start solves only sometimes (pass@64 >>
    pass@1): those GRPO may stop sampling and the focal weight keeps. A start that already
    solves most problems greedily (add_2d: pass@16 0.86 for both methods in compare_smollm2)
    leaves nothing to lose.
    """
    if not candidates:
        raise ValueError("no probed task to recommend from")
    low = {t: c for t, c in candidates.items() if c["greedy_pass_at_1"] <= max_start}
    pool = low or dict(candidates)
    return max(pool, key=lambda t: (pool[t]["headroom"], -pool[t]["greedy_pass_at_1"]))


def probe(runner: Runner, plan: Plan) -> dict[str, Any]:
    """Probe every task of `plan` (the SFT start's greedy pass@1 and pass@k on the first
    `plan.probe_problems` held-out problems), write `plan.probe_results`, return it."""
    samples, problems, results = plan.samples, plan.probe_problems, plan.probe_results
    rows: dict[str, Any] = {}
    for (label, ov, wd), task in zip(plan.probe_runs(), plan.probe_tasks, strict=True):
        ensure_run(runner, ov, wd, label)
        s = _load(os.path.join(wd, "summary.json"))
        values = pass_at_k_values(s)
        top = max(values)
        # Greedy pass@1 on the same first `problems` problems as pass@k, from the per-problem
        # record of the SFT start's greedy evaluation (the summary's is over all of them).
        solved = _sft_solved(wd)[:problems]
        greedy = sum(ch == "1" for ch in solved) / len(solved)
        wall = _load(os.path.join(wd, "run_wall_seconds.json"))["run_wall_seconds"]
        rows[task] = {
            "greedy_pass_at_1": greedy,
            "greedy_problems": len(solved),
            "greedy_pass_at_1_all": s["final_heldout_acc"],
            "greedy_pass_at_1_all_ci": s["final_heldout_ci"],
            "greedy_n_all": s["heldout_n"],
            **{f"pass_at_{k}": v for k, v in values.items()},
            **{f"pass_at_{k}_ci": s.get(f"pass_at_{k}_ci") for k in values},
            "pass_problems": s.get("pass_problems"),
            "pass_samples": s.get("pass_samples"),
            "headroom": values[top] - greedy,
            "headroom_k": top,
            "run_wall_seconds": wall,
            # Seconds per sampled row, measured: the run minus its fixed part, per row.
            "row_s": max(wall - COST["fixed_s"], 1.0) / max(samples * problems, 1),
            "overrides": TASKS[task],
        }
    rec = recommend(rows) if rows else None
    payload = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
        "machine": "2-core CPU, float32",
        "base_config": BASE_CONFIG,
        "rule": "largest pass@64 - greedy pass@1 among tasks with greedy pass@1 <= 0.5",
        "recommended_task": rec,
        "tasks": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(results)), exist_ok=True)
    with open(results, "w") as f:
        json.dump(payload, f, indent=1)
        f.write("\n")
    print(f"{'task':<14} {'greedy@1':>8} {'pass@1':>7} {'pass@' + str(samples):>8} {'headroom':>8}")
    for t, r in rows.items():
        print(
            f"{t:<14} {r['greedy_pass_at_1']:>8.3f} {r.get('pass_at_1', float('nan')):>7.3f} "
            f"{r['pass_at_' + str(r['headroom_k'])]:>8.3f} {r['headroom']:>8.3f}"
        )
    print(f"recommended task: {rec} -> {results}", flush=True)
    return payload


# ----------------------------------------------------------------------------- report


def diagnostics(wd: str) -> dict[str, list]:
    """The per-step trajectories of a run's metrics.jsonl: the paper's diagnostics and reward, and
    the greedy held-out accuracy at its evaluations."""
    from essa_jax.train.metrics import read_metrics

    rows = read_metrics(wd)
    train = [r for r in rows if r["phase"] == "train"]
    ev = [r for r in rows if r["phase"] == "eval"]
    out: dict[str, list] = {"step": [r["step"] for r in train]}
    for key in (
        "reward",
        "all_right",
        "all_wrong",
        "zero_variance",
        "entropy",
        "focal_weight_mean",
    ):
        out[key] = [r.get(key) for r in train]
    out["eval_step"] = [r["step"] for r in ev]
    out["eval_acc"] = [r["acc"] for r in ev]
    return out


def method_estimate(
    summaries: Sequence[Mapping[str, Any]], ks: Sequence[int], resamples: int
) -> dict[str, Any]:
    """pass@k of a method over its seeds: per problem the mean over seeds of the unbiased pass@k,
    then the mean over problems, with a bootstrap interval over problems (the seeds' spread is
    reported separately: the interval says which problems, not which training run)."""
    n = summaries[0]["pass_samples"]
    out: dict[str, Any] = {}
    per_k = {}
    for k in ks:
        per = np.mean([pass_at_k_per_problem(s["pass_correct"], n, k) for s in summaries], axis=0)
        per_k[k] = per
        out[f"pass_at_{k}"] = float(per.mean())
        out[f"pass_at_{k}_seeds"] = [s[f"pass_at_{k}"] for s in summaries]
    cis = bootstrap_ci(np.stack([per_k[k] for k in ks]), resamples=resamples, seed=0)
    for k, ci in zip(ks, cis, strict=True):
        out[f"pass_at_{k}_ci"] = [float(ci[0]), float(ci[1])]
    out["_per_problem"] = per_k
    return out


def report(
    out: str,
    task: str,
    methods: Sequence[str],
    seeds: Sequence[int],
    *,
    results: str,
    probe_results: str | None,
    resamples: int = 10_000,
) -> dict[str, Any]:
    """Collect the finished runs of the plan into `results` (+ .png); partial plans report what
    has finished."""
    runs, by_method = [], {}
    for m in methods:
        for seed in [0] if m == "sft" else seeds:
            wd = workdir(out, task, m, seed)
            path = os.path.join(wd, "summary.json")
            if not os.path.exists(path):
                continue
            s = _load(path)
            if "pass_correct" not in s:
                continue  # a run without per-problem pass@k cannot be pooled or paired
            wall = os.path.join(wd, "run_wall_seconds.json")
            row = {
                "method": m,
                "seed": seed,
                "workdir": wd,
                "steps": s["steps"],
                "sft_heldout_acc": s["sft_heldout_acc"],
                "heldout_acc": s["final_heldout_acc"],
                "heldout_ci": s["final_heldout_ci"],
                "heldout_n": s["heldout_n"],
                "mcnemar_p_vs_sft": s.get("mcnemar_p"),
                "train_wall_seconds": s["train_wall_seconds"],
                "run_wall_seconds": _load(wall)["run_wall_seconds"]
                if os.path.exists(wall)
                else None,
                **{k: v for k, v in s.items() if k.startswith("pass_at_")},
                "pass_samples": s["pass_samples"],
                "pass_problems": s["pass_problems"],
            }
            if m != "sft":
                row["diagnostics"] = diagnostics(wd)
            runs.append(row)
            by_method.setdefault(m, []).append((seed, s))

    payload: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
        "machine": "2-core CPU, float32",
        "issue": 21,
        "paper": "F-GRPO, arXiv 2602.06717",
        "base_config": BASE_CONFIG,
        "task": task,
        "task_overrides": TASKS.get(task),
        "methods": {m: METHODS[m] for m in methods},
        "seeds": list(seeds),
        "config_seed": 0,
        "group_size": 8,
        "batch_size": 32,
    }
    if probe_results and os.path.exists(probe_results):
        p = _load(probe_results)
        payload["probe_recommended_task"] = p.get("recommended_task")
        payload["probe"] = p.get("tasks")
    per_problem = {}
    for m, pairs in by_method.items():
        summaries = [s for _, s in pairs]
        ks = list(pass_at_k_values(summaries[0]))
        est = method_estimate(summaries, ks, resamples)
        per_problem[m] = est.pop("_per_problem")
        payload.update({f"{m}_{k}": v for k, v in est.items()})
        payload[f"{m}_steps"] = summaries[0]["steps"]
        payload[f"{m}_seeds"] = [seed for seed, _ in pairs]
        payload[f"{m}_heldout_acc"] = float(np.mean([s["final_heldout_acc"] for s in summaries]))
        payload["heldout_n"] = summaries[0]["heldout_n"]
        payload["sft_heldout_acc"] = summaries[0]["sft_heldout_acc"]
        payload["pass_samples"] = summaries[0]["pass_samples"]
        payload["pass_problems"] = summaries[0]["pass_problems"]
        payload["pass_ks"] = ks
    # Paired: the same problems and sampling key for both methods, so the per-problem differences
    # are resampled together (a paired bootstrap), tighter than two separate intervals. Each
    # F-variant against its base (the paper's claim), each trained method against the SFT start
    # (GRPO's sharpening: pass@1 up, pass@64 down).
    pairs = list(PAIRS.items()) + [(m, "sft") for m in per_problem if m != "sft"]
    for f_m, base in pairs:
        if f_m in per_problem and base in per_problem:
            ks = sorted(set(per_problem[f_m]) & set(per_problem[base]))
            diff = np.stack([per_problem[f_m][k] - per_problem[base][k] for k in ks])
            cis = bootstrap_ci(diff, resamples=resamples, seed=0)
            for k, d, ci in zip(ks, diff, cis, strict=True):
                payload[f"{f_m}_minus_{base}_pass_at_{k}"] = float(d.mean())
                payload[f"{f_m}_minus_{base}_pass_at_{k}_ci"] = [float(ci[0]), float(ci[1])]
    payload["runs"] = runs
    os.makedirs(os.path.dirname(os.path.abspath(results)), exist_ok=True)
    with open(results, "w") as f:
        json.dump(payload, f, indent=1)
        f.write("\n")
    if runs:
        plot(payload, os.path.splitext(results)[0] + ".png")
    _print_table(payload, methods)
    print(f"{len(runs)} finished runs -> {results}", flush=True)
    return payload


def _print_table(payload: Mapping[str, Any], methods: Sequence[str]) -> None:
    ks = payload.get("pass_ks", [])
    head = f"{'method':<10} {'seeds':<6} {'steps':>5} " + " ".join(
        f"{'pass@' + str(k):>22}" for k in ks
    )
    print(head)
    for m in methods:
        if f"{m}_steps" not in payload:
            continue
        cells = []
        for k in ks:
            lo, hi = payload[f"{m}_pass_at_{k}_ci"]
            cells.append(f"{payload[f'{m}_pass_at_{k}']:.3f} [{lo:.3f}, {hi:.3f}]".rjust(22))
        seeds = ",".join(map(str, payload[f"{m}_seeds"]))
        print(f"{m:<10} {seeds:<6} {payload[f'{m}_steps']:>5} " + " ".join(cells))
    for key, v in payload.items():
        if "_minus_" in key and not key.endswith("_ci"):
            lo, hi = payload[key + "_ci"]
            print(f"{key}: {v:+.3f} [{lo:+.3f}, {hi:+.3f}]")


def _smooth(ys: Sequence[float | None], window: int) -> np.ndarray:
    y = np.asarray([np.nan if v is None else v for v in ys], np.float64)
    if len(y) < window or window <= 1:
        return y
    kernel = np.ones(window) / window
    return np.convolve(y, kernel, mode="valid")


def plot(payload: Mapping[str, Any], path: str, window: int = 10) -> str:
    """pass@k against k (log axis, bootstrap intervals) per method; all-right / all-wrong group
    fractions, mean token entropy and greedy held-out accuracy against step (seed 0 of each
    method's runs; fractions and entropy as a `window`-step moving average)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from essa_jax.plot import pass_at_k_curve

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    methods = [m for m in payload["methods"] if f"{m}_steps" in payload]
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    for i, m in enumerate(methods):
        entry = {k[len(m) + 1 :]: v for k, v in payload.items() if k.startswith(f"{m}_pass_at_")}
        offset = 1.0 + 0.04 * (i - (len(methods) - 1) / 2)  # side by side at each k
        pass_at_k_curve(axes[0, 0], entry, m, color=colors[m], offset=offset)
    axes[0, 0].set(
        xlabel="k",
        ylabel="held-out pass@k (T = 1, 95% bootstrap CI)",
        title=f"{payload['task']}: {payload.get('pass_problems')} problems, "
        f"{payload.get('pass_samples')} samples",
    )
    shown = set()
    for r in payload["runs"]:
        m = r["method"]
        if m == "sft" or m in shown:
            continue
        shown.add(m)
        d = r["diagnostics"]
        steps = np.asarray(d["step"])
        if len(steps) == 0:
            continue
        x = steps[window - 1 :] if len(steps) >= window > 1 else steps
        axes[0, 1].plot(x, _smooth(d["all_right"], window), color=colors[m], label=f"{m} all right")
        axes[0, 1].plot(
            x, _smooth(d["all_wrong"], window), color=colors[m], ls="--", label=f"{m} all wrong"
        )
        axes[1, 0].plot(x, _smooth(d["entropy"], window), color=colors[m], label=m)
        axes[1, 1].plot(d["eval_step"], d["eval_acc"], marker="o", color=colors[m], label=m)
    axes[0, 1].set(xlabel="step", ylabel=f"fraction of prompt groups (mean of {window} steps)")
    axes[1, 0].set(xlabel="step", ylabel="mean token entropy of the policy (nats)")
    axes[1, 1].set(xlabel="step", ylabel="held-out accuracy (greedy)")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle("GRPO vs F-GRPO (focal, arXiv 2602.06717) on SmolLM2-135M, one SFT start")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- main


def resolve_task(task: str, probe_results: str) -> str:
    """TASK, or with "auto" the probe's recommendation."""
    if task != "auto":
        if task not in TASKS:
            raise SystemExit(f"unknown TASK {task!r}; valid: auto {' '.join(TASKS)}")
        return task
    if not os.path.exists(probe_results):
        raise SystemExit(f"TASK=auto needs the probe's {probe_results}: run --probe first")
    rec = _load(probe_results).get("recommended_task")
    if not rec:
        raise SystemExit(f"{probe_results} recommends no task")
    return rec


def _extra(pairs: Sequence[str]) -> dict[str, Any]:
    """--set a.b=value (a Python literal, else a string): overrides on top of every run's."""
    import ast

    out = {}
    for p in pairs:
        key, _, raw = p.partition("=")
        try:
            out[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key] = raw
    return out


@dataclasses.dataclass
class Plan:
    """The settings of one invocation (command line / environment)."""

    methods: list[str]
    seeds: list[int]
    steps: int
    eval_every: int
    samples: int
    problems: int
    probe_tasks: list[str]
    probe_problems: int
    out: str
    results: str
    probe_results: str
    extra: dict[str, Any]

    def probe_runs(self) -> list[tuple[str, dict[str, Any], str]]:
        """(label, overrides, workdir) of every probe run."""
        return [
            (
                f"probe {t}",
                probe_overrides(
                    t, samples=self.samples, problems=self.probe_problems, extra=self.extra
                ),
                os.path.join(self.out, "probe", t),
            )
            for t in self.probe_tasks
        ]

    def runs(self, task: str) -> list[tuple[str, dict[str, Any], str]]:
        """(label, overrides, workdir) of every comparison run, in order: seed by seed (the SFT
        start once, first), so a partial plan is already a paired comparison."""
        out = []
        for seed in self.seeds:
            for m in self.methods:
                if m == "sft" and seed != self.seeds[0]:
                    continue
                ov = run_overrides(
                    task,
                    m,
                    seed,
                    steps=self.steps,
                    eval_every=self.eval_every,
                    samples=self.samples,
                    problems=self.problems,
                    extra=self.extra,
                )
                out.append((f"{task} {m} seed {seed}", ov, workdir(self.out, task, m, seed)))
        return out

    def estimate(self, task: str, *, probe: bool, runs: bool = True) -> dict[str, float]:
        row_s = None
        if os.path.exists(self.probe_results):  # the probe's measured seconds per sampled row
            row_s = {t: r["row_s"] for t, r in _load(self.probe_results)["tasks"].items()}
        return estimate_seconds(
            task,
            self.methods if runs else [],
            self.seeds,
            self.steps,
            self.eval_every,
            self.samples,
            self.problems,
            probe,
            self.probe_tasks,
            self.probe_problems,
            row_s=row_s,
        )

    def report(self, task: str) -> dict[str, Any]:
        return report(
            self.out,
            task,
            self.methods,
            self.seeds,
            results=self.results,
            probe_results=self.probe_results,
        )


def parse_plan(argv: list[str] | None) -> tuple[Plan, argparse.Namespace]:
    env = os.environ.get
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--task", default=env("TASK", "auto"), help="auto = the probe's recommendation")
    p.add_argument("--methods", default=env("METHODS", "sft grpo fgrpo"))
    p.add_argument("--seeds", default=env("SEEDS", "0"))
    p.add_argument("--steps", type=int, default=int(env("STEPS", 150)))
    p.add_argument("--eval_every", type=int, default=int(env("EVAL_EVERY", 25)))
    p.add_argument("--samples", type=int, default=int(env("PASS_SAMPLES", 64)))
    p.add_argument("--problems", type=int, default=int(env("PASS_PROBLEMS", 200)))
    p.add_argument("--probe_tasks", default=env("PROBE_TASKS", " ".join(TASKS)))
    p.add_argument("--probe_problems", type=int, default=int(env("PROBE_PROBLEMS", 50)))
    p.add_argument("--out", default=env("OUT", "runs/compare_fgrpo"))
    p.add_argument("--results", default=env("RESULTS", RESULTS))
    p.add_argument("--probe_results", default=env("PROBE_RESULTS", PROBE_RESULTS))
    p.add_argument("--python", default=env("PY", sys.executable))
    p.add_argument("--set", action="append", default=[], help="extra override a.b=value, all runs")
    p.add_argument("--probe", action="store_true", help="run the probe only")
    p.add_argument("--report_only", action="store_true")
    p.add_argument("--dry_run", action="store_true", help="print the plan and estimate only")
    args = p.parse_args(argv)
    plan = Plan(
        methods=args.methods.split(),
        seeds=[int(x) for x in args.seeds.split()],
        steps=args.steps,
        eval_every=args.eval_every,
        samples=args.samples,
        problems=args.problems,
        probe_tasks=args.probe_tasks.split(),
        probe_problems=args.probe_problems,
        out=args.out,
        results=args.results,
        probe_results=args.probe_results,
        extra=_extra(args.set),
    )
    for m in plan.methods:
        if m not in METHODS:
            p.error(f"unknown method {m!r}; valid: {' '.join(METHODS)}")
    for t in plan.probe_tasks:
        if t not in TASKS:
            p.error(f"unknown probe task {t!r}; valid: {' '.join(TASKS)}")
    if args.task != "auto" and args.task not in TASKS:
        p.error(f"unknown TASK {args.task!r}; valid: auto {' '.join(TASKS)}")
    return plan, args


def main(argv: list[str] | None = None, runner: Runner | None = None) -> int:
    plan, args = parse_plan(argv)
    os.chdir(ROOT)
    if plan.steps < 150:
        print(f"note: STEPS={plan.steps} is below the issue's minimum of 150", file=sys.stderr)
    runner = runner or subprocess_runner(args.python)
    need_probe = args.probe or (args.task == "auto" and not os.path.exists(plan.probe_results))

    if args.dry_run:
        task = args.task
        if task == "auto":  # before the probe, the estimate assumes sub_2d's costs
            task = resolve_task(task, plan.probe_results) if not need_probe else "sub_2d"
        todo = plan.probe_runs() if need_probe else []
        todo += [] if args.probe else plan.runs(task)
        for label, ov, wd in todo:
            done = " (finished)" if os.path.exists(os.path.join(wd, "summary.json")) else ""
            print(f"# {label}{done}\n" + " ".join(command(args.python, ov, wd)))
        est = plan.estimate(task, probe=need_probe, runs=not args.probe)
        print(
            f"task {task}; estimated minutes: "
            + ", ".join(f"{k} {v / 60:.0f}" for k, v in est.items())
        )
        return 0

    if need_probe and not args.report_only:
        probe(runner, plan)
        if args.probe:
            return 0
    task = resolve_task(args.task, plan.probe_results)
    if not args.report_only:
        est = plan.estimate(task, probe=False)
        print(
            f"task {task}: {' '.join(plan.methods)} x seeds {plan.seeds}, "
            f"~{est['total'] / 3600:.1f} h"
        )
        for label, ov, wd in plan.runs(task):
            if ensure_run(runner, ov, wd, label):
                plan.report(task)  # after every run: a partial plan is already a result
    plan.report(task)
    return 0


if __name__ == "__main__":
    sys.exit(main())
