"""Controlled ablations of the default ESSA run (`make run`) on SmolLM2-135M, 2-digit addition.

Every run is the default config (`experiments/configs/essa_smollm2_arith.py`) with ONE setting
changed, run for the same budget of rollouts (population x prompts per candidate x generations,
not wall-clock, which a shared machine makes noisy; the wall-clock is recorded too), from the same
SFT adapter (`config.seed` fixed: same task data, same SFT; the seeds of a cell are
`config.search_seed`). The rank cells are the exception the question forces: each rank has its own
SFT adapter, trained for the same number of steps. The factors are the ESSA paper's own ablations
(rank, population, alpha, prompts per candidate; arXiv 2507.04453) plus this library's choices
(mirrored sampling, sigma_0, the strategy).

Each run is `python -m essa_jax.main` in its own workdir under runs/ablate_smollm2/; a run whose
summary.json exists is not re-run, and an interrupted one resumes from its last checkpoint, so the
script can be stopped and started again. Runs go seed by seed (every cell's first seed before any
cell's second), so a partial grid is already a comparison.

    experiments/ablate_smollm2.sh                        # the whole grid, then the table
    ROLLOUTS=3072 SEEDS="0 1" experiments/ablate_smollm2.sh
    .venv/bin/python experiments/ablate_smollm2.py --report_only   # table + JSON + plot so far

Writes experiments/results/ablations.json (one row per finished run) and ablations.png
(held-out accuracy per cell, seeds as points, the SFT start as a line).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "experiments/configs/essa_smollm2_arith.py"

# The grid's base: the default config as it was when the grid ran (2026-12-03, commit aea7ffe).
# The table moved the default's sigma_0 from 1 to 2; every run keeps the base's 1 unless its cell
# changes it, so the grid reproduces (and the "default" cell is that base).
BASE_OVERRIDES: dict[str, object] = {"essa.sigma_init": 1.0}
# The base's values, as docs/RESULTS.md names them; every factor's row includes the base run.
DEFAULT = {
    "sampling": "mirrored",
    "sigma_0": 1.0,
    "alpha": "top-1",
    "rank": 4,
    "population": 16,
    "prompts": "shared",
    "strategy": "cma_es",
}

# cell name -> (factor, value, config overrides). One setting changed per cell; rank keeps
# lora.alpha / rank = 2 (the LoRA scale) and "top-1" (essa.alpha = 1 / rank) so that only the
# rank moves. sep-CMA-ES and OpenAI-ES have no pairwise-selected mirrored mode (OpenAI-ES
# samples antithetically by itself), so they run plain.
CELLS: dict[str, tuple[str, object, dict[str, object]]] = {
    "default": ("default", "default", {}),
    "plain": ("sampling", "plain", {"essa.mirrored": False}),
    "sigma_0.5": ("sigma_0", 0.5, {"essa.sigma_init": 0.5}),
    "sigma_2": ("sigma_0", 2.0, {"essa.sigma_init": 2.0}),
    "alpha_all": ("alpha", "all", {"essa.alpha": 1.0}),
    "rank_2": ("rank", 2, {"lora.rank": 2, "lora.alpha": 4.0, "essa.alpha": 0.5}),
    "rank_8": ("rank", 8, {"lora.rank": 8, "lora.alpha": 16.0, "essa.alpha": 0.125}),
    "pop_8": ("population", 8, {"essa.population_size": 8}),
    "pop_32": ("population", 32, {"essa.population_size": 32}),
    "per_candidate": ("prompts", "per-candidate", {"essa.prompt_sampling": "per_candidate"}),
    "sep_cma_es": (
        "strategy",
        "sep_cma_es",
        {"essa.strategy": "sep_cma_es", "essa.mirrored": False},
    ),
    "openai_es": ("strategy", "openai_es", {"essa.strategy": "openai_es", "essa.mirrored": False}),
}
RUN_INFO = "run_info.json"  # wall-clock of the whole run and the code version
PROMPTS_PER_CANDIDATE = 16  # the default's; no cell changes it, so rollouts / generation = P x 16


def generations(cell: str, rollouts: int) -> int:
    """Generations that spend `rollouts` rollouts at this cell's population size."""
    pop = int(CELLS[cell][2].get("essa.population_size", 16))
    per_gen = pop * PROMPTS_PER_CANDIDATE
    if rollouts % per_gen:
        raise SystemExit(f"ROLLOUTS={rollouts} is not a multiple of {per_gen} (cell {cell})")
    return rollouts // per_gen


def workdir(out: str, cell: str, seed: int) -> str:
    return os.path.join(out, cell, f"seed{seed}")


def run_cell(py: str, out: str, cell: str, seed: int, rollouts: int) -> None:
    wd = workdir(out, cell, seed)
    if os.path.exists(os.path.join(wd, "summary.json")):
        return
    os.makedirs(wd, exist_ok=True)
    overrides = {
        **BASE_OVERRIDES,
        **CELLS[cell][2],
        "search_seed": seed,
        "essa.generations": generations(cell, rollouts),
        "max_wall_seconds": 0.0,  # the budget is rollouts, not seconds
        "eval.every": 0,  # held-out accuracy of the SFT start and of the end only
        "eval.base_model": False,
        "checkpoint.every": 4,  # so that a stopped grid resumes mid-run
    }
    cmd = [py, "-m", "essa_jax.main", "--config", CONFIG, "--workdir", wd]
    cmd += [f"--config.{k}={v}" for k, v in overrides.items()]
    t0 = time.time()
    print(f"[{time.strftime('%H:%M:%S')}] {cell} seed {seed}: {' '.join(cmd[5:])}", flush=True)
    with open(os.path.join(wd, "log.txt"), "a") as log:
        rc = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if rc:
        raise SystemExit(f"{cell} seed {seed} failed (exit {rc}); see {wd}/log.txt")
    with open(os.path.join(wd, RUN_INFO), "w") as f:
        json.dump({"run_wall_seconds": time.time() - t0, "code": code_version()}, f)


def code_version() -> str:
    """The commit the run's code came from, "+dirty" when the tree had uncommitted changes: every
    run of one table must come from one version (run the grid from a clean worktree)."""

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "essa_jax", "experiments")
    return git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")


def collect(out: str, rollouts: int) -> list[dict]:
    rows = []
    for cell, (factor, value, overrides) in CELLS.items():
        cell_dir = os.path.join(out, cell)
        if not os.path.isdir(cell_dir):
            continue
        for name in sorted(os.listdir(cell_dir)):
            path = os.path.join(cell_dir, name, "summary.json")
            if not os.path.exists(path):
                continue
            with open(path) as f:
                s = json.load(f)
            info_path = os.path.join(cell_dir, name, RUN_INFO)
            info = json.load(open(info_path)) if os.path.exists(info_path) else {}
            pop = int(overrides.get("essa.population_size", 16))
            rows.append(
                {
                    "cell": cell,
                    "factor": factor,
                    "value": value,
                    "overrides": overrides,
                    "seed": int(name.removeprefix("seed")),
                    "generations": s["steps"],
                    "rollouts": s["steps"] * pop * PROMPTS_PER_CANDIDATE,
                    "sft_heldout_acc": s["sft_heldout_acc"],
                    "heldout_acc": s["final_heldout_acc"],
                    "heldout_ci": s["final_heldout_ci"],
                    "heldout_n": s["heldout_n"],
                    "fixed": s.get("paired_fixed"),
                    "broken": s.get("paired_broken"),
                    "mcnemar_p": s.get("mcnemar_p"),
                    "loop_wall_seconds": s["train_wall_seconds"],
                    "run_wall_seconds": info.get("run_wall_seconds"),
                    "code": info.get("code"),
                }
            )
    return rows


def factor_table(rows: list[dict]) -> list[dict]:
    """Per factor and value: mean held-out accuracy over seeds and its gain over the SFT start.
    The default run is every factor's default value."""
    table = []
    for factor, default_value in DEFAULT.items():
        values = [default_value] + [
            v for f, v, _ in CELLS.values() if f == factor and v != default_value
        ]
        for value in values:
            cell_rows = [
                r
                for r in rows
                if (r["factor"] == factor and r["value"] == value)
                or (r["cell"] == "default" and value == default_value)
            ]
            if not cell_rows:
                continue
            accs = [r["heldout_acc"] for r in cell_rows]
            gains = [r["heldout_acc"] - r["sft_heldout_acc"] for r in cell_rows]
            table.append(
                {
                    "factor": factor,
                    "value": value,
                    "default": value == default_value,
                    "seeds": len(cell_rows),
                    "mean_acc": sum(accs) / len(accs),
                    "mean_gain": sum(gains) / len(gains),
                    "accs": accs,
                    "fixed_broken": [(r["fixed"], r["broken"]) for r in cell_rows],
                    "mcnemar_p": [r["mcnemar_p"] for r in cell_rows],
                }
            )
    return table


def markdown_table(table: list[dict]) -> str:
    """The ablation table of docs/RESULTS.md: the default run once, then one line per
    changed setting."""
    lines = [
        "| factor | value | seeds | mean held-out acc | mean gain vs SFT | per seed: acc (fixed / "
        "broken, McNemar p) |",
        "|---|---|---|---|---|---|",
    ]
    shown_default = False
    for t in table:
        if t["default"]:
            if shown_default:
                continue
            shown_default = True
        per_seed = "; ".join(
            f"{a:.3f} ({f} / {b}, p = {p:.2g})"
            for a, (f, b), p in zip(t["accs"], t["fixed_broken"], t["mcnemar_p"], strict=True)
        )
        base = ("(all)", "**the base** (sigma_0 1)")
        factor, value = base if t["default"] else (t["factor"], t["value"])
        lines.append(
            f"| {factor} | {value} | {t['seeds']} | {t['mean_acc']:.3f} | "
            f"{t['mean_gain']:+.3f} | {per_seed} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], table: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    factors = list(DEFAULT)
    fig, axes = plt.subplots(1, len(factors), figsize=(3.0 * len(factors), 3.4), sharey=True)

    def starts(t: dict) -> set[float]:
        """The SFT start(s) of a table entry's runs (the rank cells train their own)."""
        key = (t["factor"], str(t["value"]))
        cell = [r for r in rows if (r["factor"], str(r["value"])) == key]
        cell = cell or [r for r in rows if r["cell"] == "default"]
        return {r["sft_heldout_acc"] for r in cell}

    for ax, factor in zip(axes, factors, strict=True):
        entries = [t for t in table if t["factor"] == factor]
        for i, t in enumerate(entries):
            ax.scatter([i] * len(t["accs"]), t["accs"], color="C0" if t["default"] else "C1", s=18)
            ax.hlines(t["mean_acc"], i - 0.25, i + 0.25, color="k", lw=1)
            for s in starts(t):  # each value's own start, under its points
                ax.hlines(s, i - 0.4, i + 0.4, color="gray", ls="--", lw=0.9)
        ax.set_xticks(range(len(entries)), [str(t["value"]) for t in entries], rotation=30)
        ax.set_xlim(-0.6, len(entries) - 0.4)
        ax.set_title(factor)
    axes[0].set_ylabel("held-out accuracy (200, greedy)")
    fig.suptitle(
        "ESSA ablations on SmolLM2-135M add_2d (dashed: each value's SFT start; blue: default)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(out: str, rollouts: int, results: str, quiet: bool) -> None:
    rows = collect(out, rollouts)
    table = factor_table(rows)
    print(
        f"{'factor':<11} {'value':<14} {'seeds':>5} {'mean acc':>9} {'gain':>7}  "
        "per seed (fixed/broken)"
    )
    for t in table:
        per_seed = ", ".join(
            f"{a:.3f} ({f}/{b})" for a, (f, b) in zip(t["accs"], t["fixed_broken"], strict=True)
        )
        mark = " *" if t["default"] else ""
        print(
            f"{t['factor']:<11} {str(t['value']) + mark:<14} {t['seeds']:>5} "
            f"{t['mean_acc']:>9.3f} {t['mean_gain']:>+7.3f}  {per_seed}"
        )
    payload = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
        "machine": "2-core CPU (project CI class), float32",
        "quiet_machine": quiet,
        "config": CONFIG,
        "rollouts_per_run": rollouts,
        "budget_note": "population x prompts per candidate x generations; wall-clock recorded",
        "default": DEFAULT,
        "code_versions": sorted({str(r["code"]) for r in rows}),
        "runs": rows,
        "table": table,
    }
    os.makedirs(os.path.dirname(results), exist_ok=True)
    with open(results, "w") as f:
        json.dump(payload, f, indent=1)
    if rows:
        plot(rows, table, results.removesuffix(".json") + ".png")
    print(f"{len(rows)} runs -> {results}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rollouts", type=int, default=int(os.environ.get("ROLLOUTS", 3072)))
    p.add_argument("--seeds", default=os.environ.get("SEEDS", "0 1"))
    p.add_argument("--cells", default=os.environ.get("CELLS", " ".join(CELLS)))
    p.add_argument("--out", default=os.environ.get("OUT", "runs/ablate_smollm2"))
    p.add_argument(
        "--results", default=os.environ.get("RESULTS", "experiments/results/ablations.json")
    )
    p.add_argument("--python", default=os.environ.get("PY", sys.executable))
    p.add_argument("--quiet_machine", action="store_true", help="record that nothing else ran")
    p.add_argument("--report_only", action="store_true")
    p.add_argument("--markdown", action="store_true", help="print the RESULTS.md table")
    args = p.parse_args(argv)
    os.chdir(ROOT)
    cells = args.cells.split()
    unknown = [c for c in cells if c not in CELLS]
    if unknown:
        print(f"unknown cells {unknown}; valid: {' '.join(CELLS)}", file=sys.stderr)
        return 2
    seeds = [int(s) for s in args.seeds.split()]
    for cell in cells:
        generations(cell, args.rollouts)  # a budget that does not divide fails before any run
    if not args.report_only:
        for seed in seeds:
            for cell in cells:
                run_cell(args.python, args.out, cell, seed, args.rollouts)
                report(args.out, args.rollouts, args.results, args.quiet_machine)
    report(args.out, args.rollouts, args.results, args.quiet_machine)
    if args.markdown:
        print(markdown_table(factor_table(collect(args.out, args.rollouts))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
