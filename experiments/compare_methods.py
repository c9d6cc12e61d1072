"""ESSA against full-parameter GRPO at equal loop wall-clock, with seeds, on two tasks (issue #32).

The comparison the library exists for: ESSA (CMA-ES over 240 singular-value offsets of the SFT
adapter on SmolLM2-135M-Instruct, arXiv 2507.04453) against GRPO that tunes all 134.5M weights
(the papers' baseline), LoRA GRPO, full-parameter F-GRPO (arXiv 2602.06717) and SVD-GRPO (GRPO on
the singular values ESSA searches), each for the same WALL (900) seconds of loop wall-clock
(`max_wall_seconds`; SFT, evaluations and checkpoints excluded; steps / generations unbounded).

Every run is `python -m essa_jax.main` in its own workdir under OUT, from ONE SFT start per task:
`config.seed` = 0 everywhere (task data, SFT adapter, held-out problems, pass@k sampling key), the
seeds are `config.search_seed`; the full-parameter methods train the LoRA SFT adapter and start
from it folded into the weights (`train.sft_params = "lora"`). Methods (METHODS):

  essa        experiments/configs/essa_smollm2_arith.py at its defaults (sigma_0 2, 16 x 16)
  grpo_full   grpo_smollm2_arith.py with train.params = "full" (AdamW on every weight)
  grpo_lora   grpo_smollm2_arith.py (rank-4 LoRA on q k v o)
  fgrpo_full  fgrpo_smollm2_arith.py (focal gamma 0.5), train.params = "full", grpo_full's lr
  svdgrpo     svdgrpo_smollm2_arith.py (every singular value of the SFT adapter)

Every method of a task generates with the task's `generation.max_new_tokens` (compare_fgrpo's
TASKS: 5 on add_2d / sub_2d, where ESSA's own config says 4), so the held-out evaluations are the
same problems at the same length and the paired tests compare like with like.

Steps (resumable: a run whose summary.json exists is done; an interrupted one resumes from its
checkpoint; every run records the commit it ran at in <workdir>/run_record.json and a run started
at another commit is refused, unless --allow_commit_mix):

1. the learning-rate sweep, seed 0 on add_2d: grpo_full at FULL_LRS (1e-6 3e-6 1e-5 3e-5), grpo_lora
   at LORA_LRS (3e-5 1e-4 3e-4 1e-3 3e-3 around its config's 1e-4; each list grown a step at a
   time while its best was at its edge: 1e-5, then 3e-4, then 1e-3 on 2026-12-06). The best
   final held-out accuracy (ties: the higher mean over the curve) is carried to the seeded runs
   of both tasks; fgrpo_full takes grpo_full's. A sweep run at the chosen lr is also that
   method's seed-0 run on add_2d.
2. the seeded runs: TASKS (add_2d and the hard task: the probe's task with the SFT start's greedy
   pass@1 < 0.2, `hard_task`) x METHODS x SEEDS (0 1 2). Each: a greedy held-out evaluation
   (200 problems) every EVAL_SECONDS (150) of loop clock (`eval.every_seconds`; metrics.jsonl
   logs loop seconds and rollouts at each), then pass@k, k = 1, 2, 4, ..., 64, from 64 samples at
   T = 1 on the first PASS_PROBLEMS (20: 3-5 min on one core, measured) held-out problems and
   the final greedy accuracy.
3. the report (`report`): OUT_JSON (experiments/results/compare_methods.json) + .png: every run
   (commit, task, method, seed, lr, curve [(loop_s, rollouts, accuracy)], final accuracy, time to
   target, pass@k, peak RSS, numbers trained, per-step costs), per task x method the mean and
   spread over seeds, paired tests (each method vs the SFT start, ESSA vs grpo_full), the lr sweep
   and the hard task's choice; a table on stdout for the verdict.

CPU plan: each run is pinned to one core (its process's affinity, set before it starts); JOBS (1)
runs at a time, on cores FIRST_CORE (0) .. FIRST_CORE + JOBS - 1. `--dry_run` prints every run,
its command and the time estimate (runs x (fixed + WALL + evaluations + pass@k) / JOBS, constants
in COST). With --jobs 2 the sweep's last run holds one core while the other waits (the seeded
runs need its lr); instead, run two processes with disjoint METHODS, one core each, sharing OUT
and ARCHIVE. That is safe when no unfinished sweep run is in both plans: fgrpo_full plans
grpo_full's sweep too, and two processes would run one sweep run into one workdir (2026-12-06,
grpo_full's sweep finished: METHODS="grpo_full grpo_lora" on core 0, "essa svdgrpo fgrpo_full" on
core 1).

    experiments/compare_methods.sh --dry_run                  # the plan, nothing run
    nohup experiments/compare_methods.sh --jobs 2 > runs/compare_methods.log 2>&1 &
    experiments/compare_methods.sh --report_only              # the report from what is done
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as a script: import essa_jax and the experiments from this checkout
sys.path.insert(0, os.path.join(ROOT, "experiments"))

from compare_fgrpo import (  # noqa: E402
    PROBE_RESULTS,
    TASKS,
    _extra,
    _load,
    command,
    ensure_run,
    method_estimate,
    sync_records,
)

from essa_jax.evaluation import bootstrap_ci, mcnemar_exact  # noqa: E402

RESULTS = "experiments/results/compare_methods.json"
RUN_RECORD = "run_record.json"
UNBOUNDED = 1_000_000  # generations / steps: the wall-clock ends the loop
HARD_CANDIDATES = ("sub_2d", "word_problems")  # the issue's harder tasks, from the probe
HARD_MAX_START = 0.2  # the hard task's SFT start: greedy pass@1 below this

# method -> (its config, its overrides); grpo.learning_rate, where it takes one, is the sweep's.
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "essa": ("experiments/configs/essa_smollm2_arith.py", {"essa.generations": UNBOUNDED}),
    "grpo_full": (
        "experiments/configs/grpo_smollm2_arith.py",
        {"grpo.steps": UNBOUNDED, "train.params": "full", "train.sft_params": "lora"},
    ),
    "grpo_lora": ("experiments/configs/grpo_smollm2_arith.py", {"grpo.steps": UNBOUNDED}),
    "fgrpo_full": (
        "experiments/configs/fgrpo_smollm2_arith.py",
        {"grpo.steps": UNBOUNDED, "train.params": "full", "train.sft_params": "lora"},
    ),
    "svdgrpo": ("experiments/configs/svdgrpo_smollm2_arith.py", {"grpo.steps": UNBOUNDED}),
}
# Which sweep's learning rate a method runs at (fgrpo_full: GRPO-full's, as the issue asks).
LR_FROM = {"grpo_full": "grpo_full", "grpo_lora": "grpo_lora", "fgrpo_full": "grpo_full"}
SWEEP_TASK, SWEEP_SEED = "add_2d", 0

# The time model of `--dry_run`, one core per run, from the smoke of 2026-12-06 (WALL 20, essa and
# grpo_full on add_2d, one at a time on core 1 of the shared 2-core host; run_record.json and
# summary.json): a run's fixed part (interpreter, load 17-20 s, the 2-step SFT 19-28 s, compiles,
# checkpoints, the export; 130-230 s with two greedy evaluations in it), one greedy evaluation of
# the 200 held-out problems (not timed apart; assumed), one sampled pass@k row (pass@64 on 20
# problems: 184 s grpo_full, 272 s essa, compiles included).
COST = {"fixed_s": 150.0, "greedy_eval_s": 50.0, "row_s": 0.18}

Runner = Callable[[str, dict[str, Any], str], None]


# ----------------------------------------------------------------------------- plan


def pass_ks(samples: int) -> tuple[int, ...]:
    """k = 1, 2, 4, ... <= samples, and samples itself: (1, 2, 4, 8, 16, 32, 64) for 64."""
    ks = [2**i for i in range(int(math.log2(samples)) + 1)]
    return tuple(ks if ks[-1] == samples else [*ks, samples])


def hard_task(probe: Mapping[str, Any]) -> tuple[str, float]:
    """The harder task and the probe's number it rests on: among HARD_CANDIDATES whose SFT start
    has greedy pass@1 < HARD_MAX_START, the probe's recommendation if it is one of them, else the
    one with the largest headroom (pass@64 - greedy pass@1)."""
    tasks = probe.get("tasks", {})
    ok = {t: tasks[t] for t in HARD_CANDIDATES if t in tasks}
    ok = {t: r for t, r in ok.items() if r["greedy_pass_at_1"] < HARD_MAX_START}
    if not ok:
        raise SystemExit(
            f"the probe has no task of {' '.join(HARD_CANDIDATES)} with an SFT start below "
            f"{HARD_MAX_START} greedy pass@1; run experiments/compare_fgrpo.sh --probe"
        )
    rec = probe.get("recommended_task")
    task = rec if rec in ok else max(ok, key=lambda t: ok[t]["headroom"])
    return task, float(ok[task]["greedy_pass_at_1"])


def run_overrides(
    task: str,
    method: str,
    seed: int,
    lr: float | None,
    *,
    wall: float,
    eval_seconds: float,
    samples: int,
    problems: int,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """The overrides of one run on its method's config (METHODS)."""
    ov = {
        **TASKS[task],
        **METHODS[method][1],
        "seed": 0,
        "search_seed": seed,
        "task.num_heldout": 200,
        "max_wall_seconds": float(wall),
        "eval.every": 0,
        "eval.every_seconds": float(eval_seconds),
        "eval.base_model": False,
        "eval.pass_k_samples": samples,
        "eval.pass_k": pass_ks(samples),
        "eval.pass_k_problems": problems,
        # A stopped run loses at most 20 steps; one kept (a full-parameter one is 1.6 GB).
        "checkpoint.every": 20,
        "checkpoint.keep": 1,
    }
    if lr is not None:
        ov["grpo.learning_rate"] = lr
    return {**ov, **extra}


def run_dir(out: str, task: str, method: str, seed: int, lr: float | None) -> str:
    """One workdir per (task, method, lr, seed): a sweep run at the chosen lr is the seed-0 run."""
    name = method if lr is None else f"{method}_lr{lr:g}"
    return os.path.join(out, task, name, f"seed{seed}")


def curve(rows: Sequence[Mapping[str, Any]]) -> list[tuple[float, int, float]]:
    """(loop seconds, rollouts so far, greedy held-out accuracy) of every held-out evaluation of a
    run's metrics rows, the SFT start first (0, 0)."""
    ev = [r for r in rows if r["phase"] == "eval"]
    return [(float(r["wall_s"]), int(r.get("rollouts", 0)), float(r["acc"])) for r in ev]


def choose_lr(sweep: Mapping[float, Mapping[str, Any]]) -> float:
    """The sweep's best learning rate: the highest final held-out accuracy, ties to the higher
    mean accuracy over the curve (then the smaller lr). `sweep`: lr -> a run record."""
    if not sweep:
        raise ValueError("no finished sweep run to choose a learning rate from")

    def key(lr: float) -> tuple[float, float, float]:
        r = sweep[lr]
        return (r["final_acc"], float(np.mean([a for _, _, a in r["curve"]])), -lr)

    return max(sweep, key=key)


def time_to_target(points: Sequence[Sequence[float]], target: float | None) -> float | None:
    """The loop seconds of the first evaluation at or above `target`; None if none reaches it."""
    if target is None:
        return None
    return next((float(t) for t, _, a in points if a >= target - 1e-12), None)


def numbers_trained(config_path: str, overrides: Mapping[str, Any]) -> int:
    """How many numbers a method's search or optimiser changes: ESSA's genome (k = ceil(alpha r)
    singular values per factor, 2 factors per target and layer), SVD-GRPO's (the same count at
    its alpha), the LoRA factors (r (in + out) per target and layer), or the model's weights
    (`train.params` "full": `ModelConfig.num_params`; "projections": the seven kernels)."""
    from compare_fgrpo import apply_overrides

    from essa_jax.config import load_config_file, peek_model_config
    from essa_jax.lora.svd import num_free_values

    c = apply_overrides(load_config_file(os.path.join(ROOT, config_path)), overrides)
    mc = peek_model_config(c.model.path)
    shapes = mc.projection_shapes()
    if c.method == "essa" or c.method == "svdgrpo":
        k = num_free_values(c.lora.rank, c.essa.alpha)
        return 2 * k * len(c.lora.targets) * mc.num_layers
    if c.train.params == "full":
        return mc.num_params()
    if c.train.params == "projections":
        return mc.num_layers * sum(i * o for i, o in shapes.values())
    return mc.num_layers * sum(c.lora.rank * sum(shapes[t]) for t in c.lora.targets)


class Plan:
    """The runs of one invocation, in order: the sweep, then the seeded runs."""

    def __init__(self, args: argparse.Namespace, extra: Mapping[str, Any]):
        self.args, self.extra = args, dict(extra)
        self.methods, self.seeds = args.methods.split(), [int(s) for s in args.seeds.split()]
        swept = {"grpo_full": args.full_lrs, "grpo_lora": args.lora_lrs}
        wanted = {LR_FROM[m] for m in self.methods if m in LR_FROM}
        # The swept methods of this plan (the ones its methods take their lr from) -> their lrs.
        self.lrs = {m: [float(x) for x in v.split()] for m, v in swept.items() if m in wanted}

    def overrides(self, task: str, method: str, seed: int, lr: float | None) -> dict[str, Any]:
        a = self.args
        return run_overrides(
            task,
            method,
            seed,
            lr,
            wall=a.wall,
            eval_seconds=a.eval_seconds,
            samples=a.samples,
            problems=a.problems,
            extra=self.extra,
        )

    def entry(self, task: str, method: str, seed: int, lr: float | None) -> dict[str, Any]:
        ov = self.overrides(task, method, seed, lr)
        return {
            "label": f"{task} {method} seed {seed}" + ("" if lr is None else f" lr {lr:g}"),
            "task": task,
            "method": method,
            "seed": seed,
            "lr": lr,
            "config": METHODS[method][0],
            "overrides": ov,
            "workdir": run_dir(self.args.out, task, method, seed, lr),
        }

    def sweep_runs(self) -> list[dict[str, Any]]:
        return [
            self.entry(SWEEP_TASK, m, SWEEP_SEED, lr) for m, lrs in self.lrs.items() for lr in lrs
        ]

    def seeded_runs(self, tasks: Sequence[str], best: Mapping[str, float]) -> list[dict[str, Any]]:
        """Seed by seed, task by task: a partial plan is already a paired comparison."""
        out = []
        for seed in self.seeds:
            for task in tasks:
                for m in self.methods:
                    lr = best[LR_FROM[m]] if m in LR_FROM else None
                    out.append(self.entry(task, m, seed, lr))
        return out


def estimate_seconds(runs: int, *, wall: float, eval_seconds: float, pass_rows: int, jobs: int):
    """Wall-clock of `runs` runs, `jobs` at a time: each the fixed part + WALL of loop + its
    greedy evaluations (one per EVAL_SECONDS and the final one) + pass@k's sampled rows."""
    evals = (int(wall // eval_seconds) if eval_seconds else 0) + 1
    one = COST["fixed_s"] + wall + evals * COST["greedy_eval_s"] + pass_rows * COST["row_s"]
    return {"per_run_s": one, "total_s": runs * one / max(jobs, 1)}


# ----------------------------------------------------------------------------- running


def git_commit(root: str = ROOT) -> str:
    """HEAD of the checkout, with "+dirty" when tracked files differ from it."""
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return head + ("+dirty" if dirty else "")


def read_record(wd: str) -> dict[str, Any] | None:
    path = os.path.join(wd, RUN_RECORD)
    return _load(path) if os.path.exists(path) else None


def recorded(wd: str) -> bool:
    """Whether the manager has recorded how the run in `wd` ended (the last segment of its
    run_record.json, appended after the run wrote summary.json): what archiving waits for, since
    another manager sharing OUT may sync it in between (peak memory and run seconds are in it)."""
    rec = read_record(wd)
    return bool(rec and rec["segments"] and rec["segments"][-1]["exit"] == 0)


def check_commits(out: str, commit: str, allow_mix: bool) -> None:
    """Refuse (one line) to run when a run under `out` (finished or not) was started at another
    commit: one table from one commit, unless `allow_mix` (each run's commit is then reported)."""
    if allow_mix or not os.path.isdir(out):
        return
    for dirpath, _, files in os.walk(out):
        if RUN_RECORD in files and (rec := read_record(dirpath))["commit"] != commit:
            raise SystemExit(
                f"{dirpath} was started at commit {rec['commit']}, this checkout is {commit}: one "
                "table from one commit; use another OUT, check out that commit, or pass "
                "--allow_commit_mix"
            )


def pinned_runner(python: str, core: int, commit: str, env: Mapping[str, str] | None = None):
    """A Runner that starts `python -m essa_jax.main` on CPU `core` only (`run_pinned`: every
    thread JAX starts inherits the affinity), its output appended to
    <workdir>/log.txt, and appends one segment (commit, core, seconds, exit status, peak RSS from
    the child's own rusage: `os.wait4`) to <workdir>/run_record.json."""

    def run(config_path: str, overrides: dict[str, Any], wd: str) -> None:
        cmd = command(python, overrides, wd, config_path)
        rec = read_record(wd) or {"commit": commit, "segments": []}
        t0 = time.time()
        with open(os.path.join(wd, "log.txt"), "a") as log:
            rc, maxrss_kb = run_pinned(cmd, core, log, env)
        rec["segments"].append(
            {
                "commit": commit,
                "core": core,
                "started": datetime.datetime.fromtimestamp(t0, datetime.UTC).isoformat(),
                "seconds": time.time() - t0,
                "exit": rc,
                "peak_rss_mb": maxrss_kb / 1024,  # Linux reports ru_maxrss in KiB
            }
        )
        write_json(os.path.join(wd, RUN_RECORD), rec)
        if rc:
            raise SystemExit(f"run failed (exit {rc}); see {wd}/log.txt")

    return run


def run_pinned(
    cmd: Sequence[str], core: int, log: Any, env: Mapping[str, str] | None = None
) -> tuple[int, int]:
    """Run `cmd` on CPU `core` only (the library's one pinning: `essa_jax.study.runner.run_pinned`,
    `taskset -c`), from this checkout; (exit status, the command's peak RSS in KiB)."""
    from essa_jax.study.runner import run_pinned as pinned

    rc, usage = pinned(cmd, core, log, ROOT, env)
    return rc, usage.ru_maxrss


# What a finished run's record is made of (all `collect` and `--dry_run` read): small text files,
# committed under ARCHIVE so that a session that ends (and takes its workdirs with it) loses no
# finished run. Checkpoints, logs and evaluation samples stay in the workdir.
RECORD_FILES = (
    "summary.json",
    "metrics.jsonl",
    RUN_RECORD,
    "compare_overrides.json",
    "run_wall_seconds.json",
)
ARCHIVE = "experiments/results/compare_methods_runs"


def write_json(path: str, payload: Any) -> None:
    from essa_jax.workdir import write_text_atomic

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_text_atomic(path, json.dumps(payload, indent=1) + "\n")


def run_all(
    entries: Sequence[Mapping[str, Any]],
    cores: Sequence[int],
    make_runner: Callable[[int], Runner],
    commit: str,
    after_each: Callable[[], Any] = lambda: None,
    then: Callable[[Mapping[str, Any], int], Any] | None = None,
    finished: Callable[[Mapping[str, Any]], bool] | None = None,
) -> None:
    """Every unfinished entry, one per core of `cores` at a time, each pinned to its core, then
    `then(entry, core)` on the core it ran on, before another run takes it (an evaluation of the
    run), then `after_each` (the report: one at a time, matplotlib is not thread-safe). Unfinished:
    not `finished(entry)`, by default no summary.json in its workdir. A failed run stops the plan:
    the runs not yet started are cancelled, those running finish."""
    finished = finished or (lambda e: os.path.exists(os.path.join(e["workdir"], "summary.json")))
    todo = [e for e in entries if not finished(e)]
    free: queue.Queue[int] = queue.Queue()
    for c in cores:
        free.put(c)

    def one(e: Mapping[str, Any]) -> None:
        core = free.get()
        try:
            os.makedirs(e["workdir"], exist_ok=True)
            if read_record(e["workdir"]) is None:
                write_json(
                    os.path.join(e["workdir"], RUN_RECORD), {"commit": commit, "segments": []}
                )
            label = f"{e['label']} [core {core}]"
            ensure_run(make_runner(core), e["overrides"], e["workdir"], label, e["config"])
            if then is not None:
                then(e, core)
        finally:
            free.put(core)
        with reporting:
            after_each()

    reporting = threading.Lock()
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(cores)) as pool:
        futures = [pool.submit(one, e) for e in todo]
        try:
            for f in concurrent.futures.as_completed(futures):
                f.result()
        except BaseException:
            for f in futures:
                f.cancel()
            raise


# ----------------------------------------------------------------------------- report


def collect(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """A finished run's record (None if it has not finished): what the report reads of its
    workdir (summary.json, metrics.jsonl, run_record.json)."""
    from essa_jax.evaluation import pass_at_k_values
    from essa_jax.train.metrics import read_metrics

    wd = entry["workdir"]
    if not os.path.exists(os.path.join(wd, "summary.json")):
        return None
    s = _load(os.path.join(wd, "summary.json"))
    rows = read_metrics(wd)
    evals = [r for r in rows if r["phase"] == "eval"]
    train = [r for r in rows if r["phase"] == "train"]
    rec = read_record(wd) or {"commit": None, "segments": []}
    # Seconds per step by stage where the loop logs them (GRPO: rollout_s, reward_s, score_s,
    # update_s = backward + optimizer, step_s); not the loop clock or the throughputs (*_per_s).
    timing = sorted(
        {k for r in train for k in r if k.endswith("_s") and k != "wall_s" and "per_s" not in k}
    )
    steps = s["steps"]
    return {
        "task": entry["task"],
        "method": entry["method"],
        "seed": entry["seed"],
        "lr": entry["lr"],
        "workdir": wd,
        "commit": rec["commit"],
        "segment_commits": sorted({g["commit"] for g in rec["segments"]}),
        "cores": sorted({g["core"] for g in rec["segments"]}),
        "curve": curve(rows),
        "sft_acc": s["sft_heldout_acc"],
        "final_acc": s["final_heldout_acc"],
        "final_ci": s["final_heldout_ci"],
        "sft_solved": evals[0].get("solved") if evals else None,
        "final_solved": evals[-1].get("solved") if evals else None,
        "steps": steps,
        "rollouts": s.get("rollouts"),
        "loop_seconds": s["train_wall_seconds"],
        "run_seconds": sum(g["seconds"] for g in rec["segments"]) or None,
        # The stages of the finishing invocation (what a time plan is made from).
        "sft_seconds": s.get("sft_seconds"),
        "final_eval_seconds": s.get("final_eval_seconds"),
        "pass_k_seconds": s.get("pass_k_seconds"),
        "pass_at_k": {str(k): v for k, v in pass_at_k_values(s).items()},
        "pass_correct": s.get("pass_correct"),
        "pass_samples": s.get("pass_samples"),
        "peak_rss_mb": max((g["peak_rss_mb"] for g in rec["segments"]), default=None),
        "numbers_trained": numbers_trained(entry["config"], entry["overrides"]),
        "step_costs": {
            "loop_s_per_step": s["train_wall_seconds"] / steps if steps else None,
            "rollouts_per_step": (s.get("rollouts") or 0) / steps if steps else None,
            **{k: float(np.mean([r[k] for r in train if r.get(k) is not None])) for k in timing},
        },
    }


def _solved(bits: str) -> np.ndarray:
    return np.array([ch == "1" for ch in bits], np.float64)


def paired(
    pairs: Sequence[tuple[str, str]], resamples: int = 10_000, seed: int = 0
) -> dict[str, Any] | None:
    """Paired comparison of (reference, other) per-problem greedy outcomes ("0"/"1" strings on the
    same problems), one pair per seed: the mean difference other - reference per problem (mean
    over seeds) with a paired percentile-bootstrap 95% interval over problems, and an exact
    McNemar (sign) test on every (seed, problem) pair pooled."""
    pairs = [(a, b) for a, b in pairs if a and b and len(a) == len(b)]
    if not pairs:
        return None
    ref = np.stack([_solved(a) for a, _ in pairs])
    oth = np.stack([_solved(b) for _, b in pairs])
    diff = (oth - ref).mean(axis=0)
    lo, hi = bootstrap_ci(diff, resamples=resamples, seed=seed)
    test = mcnemar_exact(ref.ravel().astype(int), oth.ravel().astype(int))
    return {
        "diff": float(diff.mean()),
        "ci": [float(lo), float(hi)],
        "better": test["fixed"],  # (seed, problem) pairs the other solves and the reference not
        "worse": test["broken"],
        "mcnemar_p": test["p_value"],
        "seeds": len(pairs),
        "problems": int(ref.shape[1]),
    }


def mean_curve(curves: Sequence[Sequence[Sequence[float]]], grid: Sequence[float]) -> list:
    """The mean over runs of each run's last accuracy at or before each grid time (a step
    function: the policy evaluated last); None where a run has no evaluation yet."""
    out = []
    for t in grid:
        vals = [next((a for s, _, a in reversed(c) if s <= t), None) for c in curves]
        out.append(None if any(v is None for v in vals) else float(np.mean(vals)))
    return out


def aggregate(
    records: Sequence[Mapping[str, Any]],
    tasks: Sequence[str],
    methods: Sequence[str],
    *,
    wall: float,
    eval_seconds: float,
    resamples: int = 10_000,
) -> dict[str, Any]:
    """Per task x method: final accuracy over seeds (mean, sd, min, max), the mean curve on a
    grid of EVAL_SECONDS, time to target per seed, mean step costs, pass@k over seeds (with a
    bootstrap interval over problems), and the paired tests."""
    out: dict[str, Any] = {}
    step = eval_seconds or wall
    grid = [float(t) for t in np.arange(0.0, wall, step)]  # + each method's end (below)
    for task in tasks:
        by = {
            m: [r for r in records if r["task"] == task and r["method"] == m and r["in_table"]]
            for m in methods
        }
        targets = {r["seed"]: max(a for _, _, a in r["curve"]) for r in by.get("grpo_full", [])}
        cell: dict[str, Any] = {"target": {str(s): v for s, v in targets.items()}}
        for m, runs in by.items():
            if not runs:
                continue
            finals = [r["final_acc"] for r in runs]
            entry: dict[str, Any] = {
                "seeds": [r["seed"] for r in runs],
                "lr": runs[0]["lr"],
                "final_acc_mean": float(np.mean(finals)),
                "final_acc_sd": float(np.std(finals, ddof=1)) if len(finals) > 1 else None,
                "final_acc_min": float(min(finals)),
                "final_acc_max": float(max(finals)),
                # The last point: the latest end of a run (its last step overshoots the budget).
                "grid_s": (g := [*grid, max(r["curve"][-1][0] for r in runs)]),
                "mean_curve": mean_curve([r["curve"] for r in runs], g),
                "time_to_target": {
                    str(r["seed"]): time_to_target(r["curve"], targets.get(r["seed"])) for r in runs
                },
                "numbers_trained": runs[0]["numbers_trained"],
                "peak_rss_mb": max((r["peak_rss_mb"] or 0.0) for r in runs) or None,
                "step_costs": {
                    k: float(np.mean([r["step_costs"][k] for r in runs if r["step_costs"].get(k)]))
                    for k in sorted({k for r in runs for k, v in r["step_costs"].items() if v})
                },
                "vs_sft": paired([(r["sft_solved"], r["final_solved"]) for r in runs], resamples),
            }
            with_pass = [r for r in runs if r.get("pass_correct")]
            if with_pass:
                summaries = [
                    {
                        "pass_correct": r["pass_correct"],
                        "pass_samples": r["pass_samples"],
                        **{f"pass_at_{k}": v for k, v in r["pass_at_k"].items()},
                    }
                    for r in with_pass
                ]
                est = method_estimate(summaries, [int(k) for k in with_pass[0]["pass_at_k"]], 1000)
                est.pop("_per_problem")
                entry["pass_at_k"] = est
            cell[m] = entry
        if by.get("essa") and by.get("grpo_full"):
            full = {r["seed"]: r["final_solved"] for r in by["grpo_full"]}
            pairs = [(full[r["seed"]], r["final_solved"]) for r in by["essa"] if r["seed"] in full]
            cell["essa_vs_grpo_full"] = paired(pairs, resamples)
        out[task] = cell
    return out


def build_report(
    records: Sequence[Mapping[str, Any]],
    *,
    tasks: Sequence[str],
    methods: Sequence[str],
    sweep: Mapping[str, Any],
    hard: Mapping[str, Any],
    settings: Mapping[str, Any],
    resamples: int = 10_000,
) -> dict[str, Any]:
    """The JSON payload from finished run records (pure: the tests feed it synthetic records).
    A record's `in_table` says whether it is one of the seeded runs (the sweep's runs at an lr
    that was not chosen are listed, not aggregated)."""
    commits = sorted({c for r in records for c in [r["commit"], *r["segment_commits"]] if c})
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
        "issue": 32,
        "machine": f"{os.cpu_count()}-core CPU, float32, one core per run",
        **settings,
        "hard_task": hard,
        "lr_sweep": sweep,
        "commits": commits,
        "mixed_commits": len(commits) > 1,
        "aggregates": aggregate(
            records,
            tasks,
            methods,
            wall=settings["wall_seconds"],
            eval_seconds=settings["eval_seconds"],
            resamples=resamples,
        ),
        "runs": [
            {k: v for k, v in r.items() if k not in ("sft_solved", "pass_correct")} for r in records
        ],
    }


def sweep_summary(plan: Plan, records: Mapping[str, dict]) -> dict[str, Any]:
    """lr -> final accuracy and mean over the curve per swept method, and the chosen lr (None
    until every lr of that method has finished)."""
    out: dict[str, Any] = {"task": SWEEP_TASK, "seed": SWEEP_SEED}
    for m, lrs in plan.lrs.items():
        done = {
            lr: records[wd]
            for lr in lrs
            if (wd := run_dir(plan.args.out, SWEEP_TASK, m, SWEEP_SEED, lr)) in records
        }
        out[m] = {
            "lrs": lrs,
            "final_acc": {f"{lr:g}": r["final_acc"] for lr, r in done.items()},
            "curve_mean": {
                f"{lr:g}": float(np.mean([a for _, _, a in r["curve"]])) for lr, r in done.items()
            },
            "best": choose_lr(done) if len(done) == len(lrs) else None,
        }
    out["rule"] = "highest final held-out accuracy, ties to the higher mean over the curve"
    out["fgrpo_full"] = "grpo_full's best"
    return out


def _fmt(v: Any, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def print_table(payload: Mapping[str, Any]) -> None:
    for task, cell in payload["aggregates"].items():
        print(f"\n{task}: target (grpo_full's best per seed) {cell['target']}")
        print(
            f"{'method':<11} {'seeds':<6} {'lr':>7} {'final':>13} {'vs SFT [95% CI] p':>30} "
            f"{'time to target s':>20} {'pass@1':>7} {'pass@64':>7} {'trained':>10} "
            f"{'RSS MB':>7} {'s/step':>7} {'roll/step':>9}"
        )
        for m, e in cell.items():
            if not isinstance(e, dict) or "final_acc_mean" not in e:
                continue
            vs = e["vs_sft"]
            vs_s = (
                f"{vs['diff']:+.3f} [{vs['ci'][0]:+.3f}, {vs['ci'][1]:+.3f}] {vs['mcnemar_p']:.2g}"
                if vs
                else "-"
            )
            final = f"{e['final_acc_mean']:.3f}+-{_fmt(e['final_acc_sd'], '.3f')}"
            ttt = ",".join(_fmt(v, ".0f") for v in e["time_to_target"].values())
            pk = e.get("pass_at_k", {})
            cost = e["step_costs"]
            print(
                f"{m:<11} {','.join(map(str, e['seeds'])):<6} {_fmt(e['lr'], '.0e'):>7} "
                f"{final:>13} {vs_s:>30} {ttt:>20} {_fmt(pk.get('pass_at_1')):>7} "
                f"{_fmt(pk.get('pass_at_64')):>7} {e['numbers_trained']:>10,} "
                f"{_fmt(e['peak_rss_mb'], '.0f'):>7} {_fmt(cost.get('loop_s_per_step'), '.2f'):>7} "
                f"{_fmt(cost.get('rollouts_per_step'), '.0f'):>9}"
            )
            extra = {
                k: v for k, v in cost.items() if k not in ("loop_s_per_step", "rollouts_per_step")
            }
            if extra:
                print(
                    "            per step: " + ", ".join(f"{k} {v:.2f}" for k, v in extra.items())
                )
        ev = cell.get("essa_vs_grpo_full")
        if ev:
            print(
                f"essa - grpo_full (paired, {ev['seeds']} seeds x {ev['problems']} problems): "
                f"{ev['diff']:+.3f} [{ev['ci'][0]:+.3f}, {ev['ci'][1]:+.3f}], "
                f"{ev['better']} better / {ev['worse']} worse, McNemar p {ev['mcnemar_p']:.3g}"
            )
    print(f"\ncommits: {', '.join(payload['commits']) or '-'}")


def plot(payload: Mapping[str, Any], path: str) -> str:
    """Per task (columns): held-out accuracy against loop seconds (each seed thin, the mean over
    seeds thick), against rollouts (each seed), and pass@k against k (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(payload["aggregates"])
    fig, axes = plt.subplots(3, max(len(tasks), 1), figsize=(6 * max(len(tasks), 1), 12))
    axes = np.asarray(axes).reshape(3, -1)
    methods = list(METHODS)
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    for j, task in enumerate(tasks):
        cell = payload["aggregates"][task]
        for r in payload["runs"]:
            if r["task"] != task or r["method"] not in cell:
                continue
            if not r["in_table"]:
                continue  # a sweep run at an lr not chosen
            t, n, a = zip(*r["curve"], strict=True)
            axes[0, j].step(t, a, where="post", color=colors[r["method"]], lw=0.7, alpha=0.5)
            axes[1, j].plot(n, a, color=colors[r["method"]], lw=0.9, alpha=0.7)
        for m, e in cell.items():
            if not isinstance(e, dict) or "mean_curve" not in e:
                continue
            pts = [
                (t, a) for t, a in zip(e["grid_s"], e["mean_curve"], strict=True) if a is not None
            ]
            if pts:
                axes[0, j].step(
                    *zip(*pts, strict=True), where="post", color=colors[m], lw=2.5, label=m
                )
            pk = e.get("pass_at_k")
            if pk:
                ks = sorted(
                    int(k.split("_")[-1])
                    for k in pk
                    if k.count("_") == 2 and k.startswith("pass_at_")
                )
                axes[2, j].plot(
                    ks, [pk[f"pass_at_{k}"] for k in ks], marker="o", color=colors[m], label=m
                )
        axes[0, j].set(xlabel="loop seconds", ylabel="held-out accuracy (greedy)", title=task)
        axes[1, j].set(
            xlabel="rollouts (completions generated)", ylabel="held-out accuracy", xscale="symlog"
        )
        axes[2, j].set(xlabel="k", ylabel="pass@k (T = 1, mean over seeds)", xscale="log")
        for ax in axes[:, j]:
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    fig.suptitle(
        "ESSA vs full-parameter GRPO at equal loop wall-clock, SmolLM2-135M, one SFT start",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- main


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--tasks", default=env("TASKS", "add_2d hard"), help="hard = the probe's")
    p.add_argument("--methods", default=env("METHODS", " ".join(METHODS)))
    p.add_argument("--seeds", default=env("SEEDS", "0 1 2"))
    p.add_argument("--wall", type=float, default=float(env("WALL", 900)))
    p.add_argument("--eval_seconds", type=float, default=float(env("EVAL_SECONDS", 150)))
    p.add_argument("--samples", type=int, default=int(env("PASS_SAMPLES", 64)))
    p.add_argument("--problems", type=int, default=int(env("PASS_PROBLEMS", 20)))
    p.add_argument("--full_lrs", default=env("FULL_LRS", "1e-6 3e-6 1e-5 3e-5"))
    p.add_argument("--lora_lrs", default=env("LORA_LRS", "3e-5 1e-4 3e-4 1e-3 3e-3"))
    p.add_argument("--jobs", type=int, default=int(env("JOBS", 1)), help="runs at a time")
    p.add_argument(
        "--first_core", type=int, default=int(env("FIRST_CORE", 0)), help="runs on cores from it"
    )
    p.add_argument("--out", default=env("OUT", "runs/compare_methods"))
    p.add_argument("--out_json", default=env("OUT_JSON", RESULTS))
    p.add_argument("--probe_results", default=env("PROBE_RESULTS", PROBE_RESULTS))
    p.add_argument("--python", default=env("PY", sys.executable))
    p.add_argument("--set", action="append", default=[], help="extra override a.b=value, all runs")
    p.add_argument(
        "--archive",
        default=env("ARCHIVE", ""),
        help="finished runs' records, both ways: restored into OUT before planning, each run's "
        f"copied here when it finishes (compare_methods.sh: {ARCHIVE}; '' = off)",
    )
    p.add_argument("--allow_commit_mix", action="store_true")
    p.add_argument("--report_only", action="store_true")
    p.add_argument("--dry_run", action="store_true", help="print the plan and estimate only")
    args = p.parse_args(argv)
    for m in args.methods.split():
        if m not in METHODS:
            p.error(f"unknown method {m!r}; valid: {' '.join(METHODS)}")
    for t in args.tasks.split():
        if t != "hard" and t not in TASKS:
            p.error(f"unknown task {t!r}; valid: hard {' '.join(TASKS)}")
    ncpu = os.cpu_count() or 1  # the machine's cores (this process may itself be pinned)
    if args.jobs < 1 or args.first_core < 0 or args.first_core + args.jobs > ncpu:
        p.error(
            f"--jobs {args.jobs} from --first_core {args.first_core}: one core per run, cores "
            f"0..{ncpu - 1} (jobs >= 1, first_core + jobs <= {ncpu})"
        )
    if args.wall <= 0 or args.eval_seconds < 0 or args.samples < 1 or args.problems < 1:
        p.error("--wall > 0, --eval_seconds >= 0, --samples >= 1 and --problems >= 1")
    return args


def resolve_tasks(args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    tasks, hard = [], {}
    for t in args.tasks.split():
        if t == "hard":
            if not os.path.exists(args.probe_results):
                raise SystemExit(f"the hard task needs {args.probe_results}: run the probe first")
            name, start = hard_task(_load(args.probe_results))
            hard = {
                "task": name,
                "probe": args.probe_results,
                "probe_greedy_pass_at_1": start,
                "rule": f"a probe task of {'/'.join(HARD_CANDIDATES)} with SFT-start greedy "
                f"pass@1 < {HARD_MAX_START} (the probe's recommendation)",
            }
            t = name
        tasks.append(t)
    return tasks, hard


def main(argv: Sequence[str] | None = None, make_runner: Callable[[int], Runner] | None = None):
    args = parse(argv)
    os.chdir(ROOT)
    plan = Plan(args, _extra(args.set))
    tasks, hard = resolve_tasks(args)
    commit = git_commit()
    # The persistent compilation cache: runs of one task share shapes (most of a run's compile).
    cache = {
        "JAX_COMPILATION_CACHE_DIR": os.environ.get(
            "JAX_COMPILATION_CACHE_DIR", os.path.join(args.out, "jax_cache")
        ),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1",
    }
    make_runner = make_runner or (lambda core: pinned_runner(args.python, core, commit, cache))
    settings = {
        "base_configs": {m: METHODS[m][0] for m in plan.methods},
        "method_overrides": {m: METHODS[m][1] for m in plan.methods},
        "task_overrides": {t: TASKS[t] for t in tasks},
        "tasks": tasks,
        "methods": plan.methods,
        "seeds": plan.seeds,
        "config_seed": 0,
        "wall_seconds": args.wall,
        "eval_seconds": args.eval_seconds,
        "pass_samples": args.samples,
        "pass_problems": args.problems,
        "pass_ks": list(pass_ks(args.samples)),
        "cores_per_run": 1,
        "jobs": args.jobs,
    }

    def found(entries: Sequence[Mapping[str, Any]]) -> dict[str, dict]:
        """workdir -> record of every finished entry."""
        out = {}
        for e in entries:
            if e["workdir"] not in out and (r := collect(e)) is not None:
                out[e["workdir"]] = r
        return out

    def report() -> dict[str, Any]:
        swept = found(plan.sweep_runs())
        sweep = sweep_summary(plan, swept)
        best = {m: sweep[m]["best"] for m in plan.lrs}
        # Before the sweep has chosen, only the methods that do not take its lr are in the table.
        seeded = plan.seeded_runs(tasks, {m: v or 0.0 for m, v in best.items()})
        seeded = [e for e in seeded if e["method"] not in LR_FROM or best[LR_FROM[e["method"]]]]
        table = found(seeded)
        recs = [{**r, "in_table": wd in table} for wd, r in {**swept, **table}.items()]
        payload = build_report(
            recs, tasks=tasks, methods=plan.methods, sweep=sweep, hard=hard, settings=settings
        )
        write_json(args.out_json, payload)
        if args.archive and (
            new := sync_records(args.out, args.archive, RECORD_FILES, complete=recorded)
        ):
            print(f"archived {len(new)} finished runs -> {args.archive}: commit them", flush=True)
        if payload["runs"]:
            plot(payload, os.path.splitext(args.out_json)[0] + ".png")
        print_table(payload)
        print(f"{len(payload['runs'])} finished runs -> {args.out_json}", flush=True)
        return payload

    if args.archive and (
        back := sync_records(args.archive, args.out, RECORD_FILES, complete=recorded)
    ):
        print(f"restored {len(back)} finished runs from {args.archive} into {args.out}", flush=True)
    if args.dry_run:
        return dry_run(plan, tasks, hard, args)
    if not args.report_only:
        check_commits(args.out, commit, args.allow_commit_mix)
        cores = range(args.first_core, args.first_core + args.jobs)
        run_all(plan.sweep_runs(), cores, make_runner, commit, report)
        chosen = sweep_summary(plan, found(plan.sweep_runs()))
        best = {m: chosen[m]["best"] for m in plan.lrs}
        print(f"learning rates carried to the seeded runs: {best}", flush=True)
        run_all(plan.seeded_runs(tasks, best), cores, make_runner, commit, report)
    report()
    return 0


def dry_run(plan: Plan, tasks: Sequence[str], hard: Mapping[str, Any], args) -> int:
    """Every run (the sweep, then the seeded runs at the sweep's lr: its best when known, else the
    middle lr, marked), its command, its core, and the time estimate."""
    sweep = plan.sweep_runs()
    done = {e["workdir"]: collect(e) for e in sweep}
    chosen = sweep_summary(plan, {k: v for k, v in done.items() if v is not None})
    best = {m: chosen[m]["best"] or plan.lrs[m][len(plan.lrs[m]) // 2] for m in plan.lrs}
    known = all(chosen[m]["best"] is not None for m in plan.lrs)
    seeded = [e for e in plan.seeded_runs(tasks, best) if e["workdir"] not in done]
    if hard:
        print(f"hard task: {hard['task']} (probe greedy pass@1 {hard['probe_greedy_pass_at_1']})")
    if not known:
        print(f"the sweep's lr is not known yet: the seeded GRPO runs are shown at {best}")
    entries = sweep + seeded
    for i, e in enumerate(entries):
        state = " (finished)" if os.path.exists(os.path.join(e["workdir"], "summary.json")) else ""
        core = args.first_core + i % args.jobs
        print(f"# {e['label']}{state} [core {core}]")
        print(
            f"taskset -c {core} "
            + " ".join(command(args.python, e["overrides"], e["workdir"], e["config"]))
        )
    todo = [e for e in entries if not os.path.exists(os.path.join(e["workdir"], "summary.json"))]
    est = estimate_seconds(
        len(todo),
        wall=args.wall,
        eval_seconds=args.eval_seconds,
        pass_rows=args.samples * args.problems,
        jobs=args.jobs,
    )
    print(
        f"{len(entries)} runs ({len(sweep)} sweep, {len(seeded)} seeded), {len(todo)} to run, "
        f"{args.jobs} at a time, "
        f"one core each: ~{est['per_run_s'] / 60:.0f} min per run (fixed {COST['fixed_s']:.0f} s + "
        f"{args.wall:.0f} s loop + evaluations + pass@{args.samples} on {args.problems} problems), "
        f"~{est['total_s'] / 3600:.1f} h for those to run"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
