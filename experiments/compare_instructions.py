"""ESSA beyond math: base -> SFT -> ESSA and -> GRPO on the generated instruction task (issue #33).

The ESSA paper (arXiv 2507.04453 v3) reports ESSA raising Llama-3.1-8B on IFEval by 22.5 points
over GRPO; every other result here is arithmetic. This runs the same question at the scale this
machine allows: SmolLM2-135M-Instruct on `instructions` (one or two IFEval instructions per
prompt, `essa_jax.data.instructions`), fitness / reward = IFEval's instruction-level strict score.

Steps (each run is `python -m essa_jax.main` in its own workdir under OUT; a run whose
summary.json exists is not re-run, an interrupted one resumes from its last checkpoint; each
evaluation writes <workdir>/lm_eval.json and is skipped when that exists, so the script can be
stopped and started again):

1. `sft`: the SFT start (experiments/configs/essa_smollm2_instructions.py with method "sft"; the
   base model's held-out accuracy comes with it, `eval.base_model`).
2. for each seed in SEEDS (`config.search_seed`; `config.seed` = 0 everywhere, so every run starts
   from the one SFT adapter and is evaluated on the same 200 held-out prompts): `essa`
   (essa_smollm2_instructions.py) and `grpo` (grpo_smollm2_instructions.py), each with the same
   loop wall-clock WALL seconds (`max_wall_seconds`; generations / steps unbounded).
3. every model through lm-eval (`python -m essa_jax.evaluate_lm --ifeval_file`): the held-out
   prompts as an IFEval task (lm-eval's own `ifeval` metrics and checkers), greedy, 64 new tokens,
   the chat template as in training: the base model (the SFT run with `--no_adapter`), SFT, and
   each ESSA / GRPO run's final adapter. Per instruction type: strict / loose accuracy.
4. the report: experiments/results/compare_instructions.json (per method: prompt- / instruction-
   level strict and loose accuracy, mean and per seed; per instruction type; loop wall-clock,
   generations / steps done) and a table on stdout.

Resuming across sessions: each run's record (summary.json, metrics.jsonl, lm_eval.json, ...; not
its checkpoints) is copied to ARCHIVE (compare_instructions.sh: experiments/results/
compare_instructions_runs) once it is evaluated, and restored into OUT before planning: commit
ARCHIVE, and a later session's worktree at the same commit, with ARCHIVE copied in, goes on
without re-running them.

Time (measured 2026-12-06 with `--jobs 2` on the quiet 2-core Intel Xeon host, float32): the SFT
stage (training, its held-out pass, the base's, two lm-eval passes) 8 min; then per seed, on one
core each, an ESSA generation (16 candidates x 8 greedy prompts, stopping at EOS) 60-75 s, a GRPO
step (32 rollouts + update) ~55 s, a held-out or lm-eval pass (200 rows) ~2.5 min, so a seed's
pair of runs with WALL = 1800 s takes ~39 min: the default plan (3 seeds) ~2 h, one at a time
(`--jobs 1`) about twice that. `--dry_run` prints the commands.

CPU plan: `--jobs 1` (JOBS; the default) runs one run at a time on every core. `--jobs 2` runs
the SFT run first (on every core), then a seed's ESSA and GRPO runs side by side, each pinned to
one core (`taskset`: the same hardware for both, and WALL of loop each), each evaluated on its own
core when it ends; the cores each run used are in its run_record.json and in the report
(`pinned_cores`). On the 2-core machine that halves the plan's time, at the price of each run
doing about half the generations / steps it would on both cores.

    experiments/compare_instructions.sh                     # the plan above, then the report
    SEEDS="0 1 2 3" WALL=3600 experiments/compare_instructions.sh
    JOBS=2 experiments/compare_instructions.sh              # ESSA and GRPO side by side
    experiments/compare_instructions.sh --dry_run           # commands only
    experiments/compare_instructions.sh --report_only       # the report from what is done
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as a script: import essa_jax and the experiments from this checkout
sys.path.insert(0, os.path.join(ROOT, "experiments"))

from compare_fgrpo import command, ensure_run, subprocess_runner, sync_records  # noqa: E402
from compare_methods import (  # noqa: E402
    RUN_RECORD,
    git_commit,
    numbers_trained,
    paired,
    pinned_runner,
    run_all,
    run_pinned,
)

ESSA_CONFIG = "experiments/configs/essa_smollm2_instructions.py"
GRPO_CONFIG = "experiments/configs/grpo_smollm2_instructions.py"
RESULTS = "experiments/results/compare_instructions.json"
METRICS = (
    "prompt_level_strict_acc",
    "inst_level_strict_acc",
    "prompt_level_loose_acc",
    "inst_level_loose_acc",
)
UNBOUNDED = 1_000_000  # generations / steps: the wall-clock ends the loop
# A finished and evaluated run's record (all `report` reads; small text), committed under ARCHIVE
# so that a session's end loses only the run in flight: restored into OUT before planning.
RECORD_FILES = (
    "summary.json",
    "metrics.jsonl",
    "lm_eval.json",
    "base_lm_eval.json",
    "compare_overrides.json",
    "run_wall_seconds.json",
    RUN_RECORD,  # --jobs > 1: the core each segment ran on
)
ARCHIVE = "experiments/results/compare_instructions_runs"


def plan_runs(seeds: list[int], wall: float) -> list[tuple[str, str, dict[str, Any], str]]:
    """(label, config path, overrides, workdir name) of every training run, in order."""
    runs = [("sft", ESSA_CONFIG, {"method": "sft"}, "sft")]
    for s in seeds:
        # Held-out passes at the start (the SFT adapter) and the end only: each is 200 rows of 64
        # new tokens (minutes on one core), the SFT run already scores the base model, and what
        # is compared is the final model's lm-eval score at equal loop wall-clock.
        common = {
            "search_seed": s,
            "max_wall_seconds": wall,
            "eval.every": 0,
            "eval.base_model": False,
        }
        runs.append(
            (f"essa seed {s}", ESSA_CONFIG, {**common, "essa.generations": UNBOUNDED}, f"essa_s{s}")
        )
        runs.append(
            (f"grpo seed {s}", GRPO_CONFIG, {**common, "grpo.steps": UNBOUNDED}, f"grpo_s{s}")
        )
    return runs


def heldout_file(out: str) -> str:
    """The run's held-out prompts as IFEval rows (the task of ESSA_CONFIG, config.seed = 0)."""
    from essa_jax.config import load_config_file
    from essa_jax.data import load_task
    from essa_jax.train.tasks import data_task_config

    path = os.path.join(out, "heldout_ifeval.jsonl")
    if not os.path.exists(path):
        config = load_config_file(os.path.join(ROOT, ESSA_CONFIG))
        task = load_task(data_task_config(config.task, config.seed))
        keep = ("key", "prompt", "instruction_id_list", "kwargs")
        os.makedirs(out, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            for ex in task.eval:
                f.write(json.dumps({k: ex[k] for k in keep}) + "\n")
        os.replace(path + ".tmp", path)
    return path


def eval_command(python: str, wd: str, heldout: str, out_json: str, base: bool) -> list[str]:
    cmd = [
        python,
        "-m",
        "essa_jax.evaluate_lm",
        "--run",
        wd,
        "--ifeval_file",
        heldout,
        "--max_gen_toks",
        "64",
        "--apply_chat_template",
        "--batch_size",
        "32",
        "--output",
        out_json,
    ]
    return cmd + (["--no_adapter"] if base else [])


def ensure_eval(
    python: str, wd: str, heldout: str, out_json: str, base: bool = False, core: int | None = None
) -> None:
    """Evaluate `wd`'s model into `out_json` unless it exists; on CPU `core` only when given (the
    core its run trained on, `--jobs` > 1)."""
    if os.path.exists(out_json):
        return
    cmd = eval_command(python, wd, heldout, out_json, base)
    with open(os.path.join(wd, "log.txt"), "a") as log:
        if core is None:
            rc = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        else:  # pinned as the runs are (compare_methods.run_pinned)
            rc, _ = run_pinned(cmd, core, log)
    if rc:
        raise SystemExit(f"lm-eval evaluation failed (exit {rc}); see {wd}/log.txt")


def _load(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _entry(lm_eval: dict[str, Any], summary: dict[str, Any] | None) -> dict[str, Any]:
    res = lm_eval["results"]["ifeval_local"]
    out = {m: float(res[f"{m},none"]) for m in METRICS}
    out["per_instruction"] = lm_eval["per_instruction"]["ifeval_local"]
    if summary is not None:
        out["summary"] = {
            k: summary[k]
            for k in (
                "sft_heldout_acc",
                "final_heldout_acc",
                "base_heldout_acc",
                "steps",
                "train_wall_seconds",
                "generated_tokens",
            )
            if k in summary
        }
    return out


def _evals(wd: str) -> list[dict[str, Any]]:
    """The run's held-out evaluations in order (metrics.jsonl rows of phase "eval"): the SFT start
    (step 0) first, the final model last; each with its per-prompt "solved" string."""
    path = os.path.join(wd, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if r.get("phase") == "eval"]


def report(out: str, seeds: list[int]) -> dict[str, Any]:
    """Collect every finished evaluation under `out` into the results dict (module docstring).

    Besides lm-eval's scores, the paired comparisons use each run's own held-out evaluations
    (the same 200 prompts, greedy, the same checkers: their prompt-level strict accuracy is
    lm-eval's, `lm_eval_agrees` checks it per run): per prompt, solved at the SFT start and at the
    end (`compare_methods.paired`: mean difference over prompts with a paired bootstrap 95%
    interval, exact McNemar test pooled over seeds) for ESSA vs SFT, GRPO vs SFT and ESSA vs GRPO
    (same seed)."""
    methods: dict[str, list[dict[str, Any]]] = {}
    solved: dict[tuple[str, int], tuple[str, str]] = {}  # (method, seed) -> (start, final)
    base = _load(os.path.join(out, "sft", "base_lm_eval.json"))
    if base is not None:
        methods["base"] = [_entry(base, None)]
    sft = _load(os.path.join(out, "sft", "lm_eval.json"))
    if sft is not None:
        methods["sft"] = [_entry(sft, _load(os.path.join(out, "sft", "summary.json")))]
    for method in ("essa", "grpo"):
        for s in seeds:
            wd = os.path.join(out, f"{method}_s{s}")
            ev = _load(os.path.join(wd, "lm_eval.json"))
            if ev is not None:
                e = _entry(ev, _load(os.path.join(wd, "summary.json")))
                # --jobs > 1: the cores its segments were pinned to (one each); else every core.
                rec = _load(os.path.join(wd, RUN_RECORD))
                e["pinned_cores"] = sorted({g["core"] for g in rec["segments"]}) if rec else None
                if rec:  # the largest of its segments' peak RSS (host memory, MB)
                    e["peak_rss_mb"] = max(g["peak_rss_mb"] for g in rec["segments"])
                if evs := _evals(wd):
                    e["heldout_curve"] = [[r["wall_s"], r["acc"]] for r in evs]
                    e["lm_eval_agrees"] = abs(e["prompt_level_strict_acc"] - evs[-1]["acc"]) < 1e-9
                    solved[method, s] = (evs[0]["solved"], evs[-1]["solved"])
                methods.setdefault(method, []).append({"seed": s, **e})
    table = {}
    for method, runs in methods.items():
        row = {m: float(np.mean([r[m] for r in runs])) for m in METRICS}
        types = sorted({t for r in runs for t in r["per_instruction"]})
        row["per_instruction_strict"] = {
            t: float(np.mean([r["per_instruction"][t]["strict"] for r in runs])) for t in types
        }
        row["runs"] = runs
        table[method] = row
    both = [s for s in seeds if ("essa", s) in solved and ("grpo", s) in solved]
    comparisons = {
        "essa_vs_sft": paired([v for (m, _), v in solved.items() if m == "essa"]),
        "grpo_vs_sft": paired([v for (m, _), v in solved.items() if m == "grpo"]),
        # diff = ESSA - GRPO: positive when ESSA solves more of the prompts.
        "essa_vs_grpo": paired([(solved["grpo", s][1], solved["essa", s][1]) for s in both]),
    }
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M+00:00"),
        "configs": [ESSA_CONFIG, GRPO_CONFIG],
        "seeds": seeds,
        # What each search / optimiser changes: ESSA's singular values, GRPO's LoRA factors.
        "numbers_trained": {
            "essa": numbers_trained(ESSA_CONFIG, {}),
            "grpo": numbers_trained(GRPO_CONFIG, {}),
        },
        "methods": table,
        "paired_prompt_level_strict": comparisons,
    }


def print_table(result: dict[str, Any]) -> None:
    methods = result["methods"]
    print("method  " + "  ".join(f"{m[:-4]:>20}" for m in METRICS))
    for method, row in methods.items():
        print(f"{method:7s} " + "  ".join(f"{row[m]:20.3f}" for m in METRICS))
    types = sorted({t for row in methods.values() for t in row["per_instruction_strict"]})
    if types:
        print(f"\n{'instruction type (strict)':40s}" + "".join(f"{m:>8s}" for m in methods))
    for t in types:
        cells = [row["per_instruction_strict"].get(t) for row in methods.values()]
        print(f"{t:40s}" + "".join(f"{c:8.3f}" if c is not None else f"{'-':>8s}" for c in cells))
    for method in ("essa", "grpo"):
        for r in methods.get(method, {}).get("runs", []):
            sm = r.get("summary", {})
            print(
                f"{method} seed {r['seed']}: {sm.get('steps')} updates in "
                f"{sm.get('train_wall_seconds', 0):.0f} s of loop, cores {r['pinned_cores']}"
            )
    for name, c in result.get("paired_prompt_level_strict", {}).items():
        if c is not None:
            print(
                f"{name}: {c['diff']:+.3f} [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}], "
                f"{c['better']} better / {c['worse']} worse, McNemar p = {c['mcnemar_p']:.3g}"
            )


def markdown(result: dict[str, Any]) -> str:
    """The report as the markdown tables of docs/RESULTS.md: the four IFEval scores per method
    (mean over seeds, each seed's prompt-level strict in brackets), strict accuracy per instruction
    type, and the paired comparisons."""
    methods = result["methods"]
    names = list(methods)
    lines = [
        "| method | prompt strict | inst. strict | prompt loose | inst. loose | per seed (prompt "
        "strict) | updates in loop s |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, row in methods.items():
        runs = [r for r in row["runs"] if "seed" in r]
        seeds = " / ".join(f"{r['prompt_level_strict_acc']:.3f}" for r in runs) or "-"
        steps = " / ".join(
            f"{r['summary']['steps']} in {r['summary']['train_wall_seconds']:.0f}"
            for r in runs
            if "steps" in r.get("summary", {})
        )
        cells = " | ".join(f"{row[k]:.3f}" for k in METRICS)
        lines.append(f"| {m} | {cells} | {seeds} | {steps or '-'} |")
    types = sorted({t for row in methods.values() for t in row["per_instruction_strict"]})
    n = {
        t: r["per_instruction"][t]["n"]
        for row in methods.values()
        for r in row["runs"]
        for t in r["per_instruction"]
    }
    lines += ["", "| instruction type (strict) | n | " + " | ".join(names) + " |"]
    lines.append("|---|---|" + "---|" * len(names))
    for t in types:
        cells = [methods[m]["per_instruction_strict"].get(t) for m in names]
        lines.append(
            f"| `{t}` | {n[t]} | "
            + " | ".join("-" if c is None else f"{c:.3f}" for c in cells)
            + " |"
        )
    lines += [
        "",
        "| paired, prompt-level strict | difference [95% CI] | better / worse | McNemar p |",
    ]
    lines.append("|---|---|---|---|")
    for name, c in result.get("paired_prompt_level_strict", {}).items():
        if c is not None:
            pair = " vs ".join(name.upper().split("_VS_"))
            lines.append(
                f"| {pair} ({c['seeds']} seeds x {c['problems']}) "
                f"| {c['diff']:+.3f} [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}] | {c['better']} / "
                f"{c['worse']} | {c['mcnemar_p']:.3g} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--dry_run", action="store_true")
    p.add_argument("--report_only", action="store_true")
    p.add_argument("--markdown", action="store_true", help="also print the tables as markdown")
    p.add_argument("--python", default=os.environ.get("PY", sys.executable))
    p.add_argument(
        "--jobs",
        type=int,
        default=int(os.environ.get("JOBS", "1")),
        help="ESSA / GRPO runs at a time, each pinned to one core (1: one run on every core)",
    )
    args = p.parse_args(argv)
    ncpu = os.cpu_count() or 1
    if not 1 <= args.jobs <= ncpu:
        p.error(f"--jobs {args.jobs}: one core per run, so 1..{ncpu} on this machine")
    seeds = [int(s) for s in os.environ.get("SEEDS", "0 1 2").split()]
    wall = float(os.environ.get("WALL", "1800"))
    out = os.environ.get("OUT", "runs/compare_instructions")
    results = os.environ.get("RESULTS", RESULTS)
    archive = os.environ.get("ARCHIVE", "")  # compare_instructions.sh: ARCHIVE
    runs = plan_runs(seeds, wall)
    if archive and (back := sync_records(archive, out, RECORD_FILES, done="lm_eval.json")):
        print(f"restored {len(back)} finished runs from {archive} into {out}", flush=True)
    if args.dry_run:
        for label, cfg, ov, name in runs:
            wd = os.path.join(out, name)
            print(f"# {label}\n" + " ".join(command(args.python, ov, wd, cfg)))
            print(" ".join(eval_command(args.python, wd, "<heldout>", f"{wd}/lm_eval.json", False)))
        sft = os.path.join(out, "sft")
        print(
            " ".join(eval_command(args.python, sft, "<heldout>", f"{sft}/base_lm_eval.json", True))
        )
        return 0
    if not args.report_only:
        heldout = heldout_file(out)
        runner = subprocess_runner(args.python)

        def archived() -> None:
            # Evaluated (the base too, for the SFT run): its record can outlive this session.
            if archive and (new := sync_records(out, archive, RECORD_FILES, done="lm_eval.json")):
                print(f"archived {', '.join(new)} -> {archive}: commit it", flush=True)

        # With --jobs > 1 only the SFT run goes first, on every core: the others start from it.
        for label, cfg, ov, name in runs if args.jobs == 1 else runs[:1]:
            wd = os.path.join(out, name)
            ensure_run(runner, ov, wd, label, config_path=cfg)
            ensure_eval(args.python, wd, heldout, os.path.join(wd, "lm_eval.json"))
            if name == "sft":
                ensure_eval(args.python, wd, heldout, os.path.join(wd, "base_lm_eval.json"), True)
            archived()
        if args.jobs > 1:
            # In plan order, so a seed's ESSA and GRPO runs go side by side: the same loop
            # wall-clock on the same hardware (one core each), each evaluated on its own core.
            commit = git_commit()
            entries = [
                {"label": label, "config": cfg, "overrides": ov, "workdir": os.path.join(out, name)}
                for label, cfg, ov, name in runs[1:]
            ]
            run_all(
                entries,
                range(args.jobs),
                lambda core: pinned_runner(args.python, core, commit),
                commit,
                after_each=archived,
                then=lambda e, core: ensure_eval(
                    args.python, e["workdir"], heldout, f"{e['workdir']}/lm_eval.json", core=core
                ),
                finished=lambda e: os.path.exists(os.path.join(e["workdir"], "lm_eval.json")),
            )
    result = report(out, seeds)
    os.makedirs(os.path.dirname(results) or ".", exist_ok=True)
    with open(results + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    os.replace(results + ".tmp", results)
    print_table(result)
    if args.markdown:
        print("\n" + markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
