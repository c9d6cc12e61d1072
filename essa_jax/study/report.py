"""A study's report from its runs' records: the sweep's choices, every run's curve, the final
test accuracies with intervals over seeds and problems, time to fixed targets, load flags.

Reads only the small records `runner.sync_records` archives (summary.json, metrics.jsonl,
run_record.json, run_plan.json), so a report can be rebuilt from a clean checkout.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from essa_jax.study import stats
from essa_jax.study.runner import RUN_PLAN, RUN_RECORD, SUMMARY, finished, read_json
from essa_jax.study.spec import (
    RunSpec,
    center_values,
    changes_start,
    factor_fields,
    grid,
    held_factors,
    plan_study,
)


def _rows(workdir: str) -> list[dict[str, Any]]:
    from essa_jax.train.metrics import read_metrics

    return read_metrics(workdir)


def collect(spec: RunSpec, min_cpu_share: float = 0.9) -> dict[str, Any] | None:
    """A finished run's record (None while unfinished): the summary's numbers, the validation
    curve [(step, rollouts, cpu_s, wall_s, acc, load1)], the test evaluation's per-problem
    outcomes, peak RSS and the flags of a run that shared its core."""
    wd = spec.workdir
    if not finished(wd):
        return None
    s = read_json(os.path.join(wd, SUMMARY))
    rows = _rows(wd)
    evals = [r for r in rows if r["phase"] == "eval"]
    tests = [r for r in rows if r["phase"] == "test"]
    curve = [
        (
            r["step"],
            r.get("rollouts", 0),
            r.get("cpu_s", math.nan),
            r.get("wall_s", 0.0),
            r["acc"],
            r.get("load1", math.nan),
        )
        for r in evals
    ]
    rec_path = os.path.join(wd, RUN_RECORD)
    rec = read_json(rec_path) if os.path.exists(rec_path) else {"segments": []}
    segs = rec.get("segments", [])
    cpu, wall = s.get("train_cpu_seconds", 0.0), s.get("train_wall_seconds", 0.0)
    share = cpu / wall if wall else math.nan
    loads = [c[5] for c in curve if not math.isnan(c[5])]
    flags = []
    if wall and share < min_cpu_share:
        flags.append(f"loop CPU share {share:.2f} < {min_cpu_share} (its core was shared)")
    if len({seg.get("commit") for seg in segs}) > 1:
        flags.append("segments at several commits")
    return {
        "stage": spec.stage,
        "task": spec.task,
        "name": spec.name,
        "arm": spec.arm,
        "seed": spec.seed,
        "factor": spec.factor,
        "value": spec.value,
        "extension": spec.extension,
        "workdir": wd,
        "commit": rec.get("commit"),
        "overrides": read_json(os.path.join(wd, RUN_PLAN))
        if os.path.exists(os.path.join(wd, RUN_PLAN))
        else dict(spec.overrides),
        "final_split": s.get("final_split", "test"),
        "test_acc": s["final_heldout_acc"] if s.get("final_split", "test") == "test" else None,
        "test_solved": tests[-1].get("solved") if tests else None,
        # A start's final policy is its SFT adapter (runs before `final_validation_acc` existed
        # recorded only `sft_validation_acc`).
        "validation_acc": s.get("final_validation_acc")
        if s.get("final_validation_acc") is not None or spec.stage != "start"
        else s.get("sft_validation_acc"),
        "sft_test_acc": s.get("sft_heldout_acc"),
        "sft_validation_acc": s.get("sft_validation_acc"),
        "steps": s.get("steps", 0),
        "rollouts": s.get("rollouts", 0),
        "loop_cpu_s": cpu,
        "loop_wall_s": wall,
        "cpu_share": share,
        "load_max": max(loads) if loads else None,
        "load_at_start": s.get("load_at_start"),
        "peak_rss_mb": max((seg.get("peak_rss_mb", 0) for seg in segs), default=None),
        "curve": curve,
        "pass_at_k": {k: v for k, v in s.items() if k.startswith("pass_at_") and "_ci" not in k},
        "sft_early_stopping": s.get("sft_early_stopping"),
        "flags": flags,
    }


def sweep_records(study: Any) -> dict[str, list[dict[str, Any]]]:
    """arm -> its finished sweep runs' records."""
    out: dict[str, list[dict[str, Any]]] = {}
    for spec in plan_study(study):
        if spec.stage == "sweep":
            rec = collect(spec, study.min_cpu_share)
            if rec is not None:
                out.setdefault(spec.arm, []).append(rec)
    return out


def _score(rec: Mapping[str, Any], gain: bool = False) -> tuple[float, float]:
    """A sweep run's rank: final validation accuracy, ties to the higher mean over its curve; with
    `gain`, both less the run's own SFT start's validation accuracy (for factors that change the
    start: a better start is not a better search)."""
    curve = [c[4] for c in rec["curve"]]
    base = (rec.get("sft_validation_acc") or 0.0) if gain else 0.0
    return (
        (rec["validation_acc"] or 0.0) - base,
        (float(np.mean(curve)) if curve else 0.0) - base,
    )


def _best(study: Any, arm: str, factor: str, records: Sequence[Mapping[str, Any]]) -> Any:
    """The best value of one factor (`_score`) among the center run and the runs that vary it;
    a factor that changes the SFT start is scored by gain over each run's own start."""
    center = next(r for r in records if not r["factor"])
    cands = [(center_values(study, arm)[factor], center)] + [
        (r["value"], r) for r in records if r["factor"] == factor
    ]
    return max(cands, key=lambda vr: _score(vr[1], gain=changes_start(factor)))[0]


def choose(study: Any, arm: str, records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The arm's chosen value of every sweep factor, or None while its sweep is unfinished: per
    factor, the best (`_score`) of the center run and the runs that vary that factor. A factor
    that changes the SFT start is scored by gain over each run's own start; a held factor
    (`spec.held_factors`) keeps the arm's own value."""
    planned = [s for s in plan_study(study) if s.stage == "sweep" and s.arm == arm]
    if len(records) < len(planned):
        return None
    centers, held = center_values(study, arm), held_factors(study, arm)
    return {
        factor: centers[factor] if factor in held else _best(study, arm, factor, records)
        for factor in dict(study.arms[arm].get("sweep") or {})
    }


def choices(study: Any) -> dict[str, dict[str, Any]]:
    """arm -> factor -> chosen value, for every arm whose sweep has finished."""
    recs = sweep_records(study)
    out = {}
    for arm, spec in study.arms.items():
        if spec.get("sweep"):
            c = choose(study, arm, recs.get(arm, []))
            if c is not None:
                out[arm] = c
    return out


def sweep_summary(study: Any) -> dict[str, Any]:
    """Per swept arm: every run (factor, value, validation accuracy, mean curve), the choice and
    whether a chosen numeric value sits at the edge of its grid (then the grid should grow)."""
    recs = sweep_records(study)
    out = {}
    for arm, spec in study.arms.items():
        sweep = dict(spec.get("sweep") or {})
        if not sweep:
            continue
        rows = [
            {
                "factor": r["factor"] or "(center)",
                "value": r["value"],
                "validation_acc": r["validation_acc"],
                "start_validation_acc": r["sft_validation_acc"],
                "curve_mean": _score(r)[1],
                "steps": r["steps"],
                "extension": r.get("extension", False),
                "flags": r["flags"],
            }
            for r in recs.get(arm, [])
        ]
        chosen = choose(study, arm, recs.get(arm, []))
        edges = {}
        if chosen:
            for factor in sweep:
                vals = grid(spec, factor)
                numeric = all(isinstance(v, int | float) for v in vals) and len(vals) > 2
                if numeric:
                    edges[factor] = chosen[factor] in (min(vals), max(vals))
        out[arm] = {
            "factors": {f: grid(spec, f) for f in sweep},
            "extended": {f: list(v) for f, v in dict(spec.get("extend") or {}).items()},
            "fields": {f: factor_fields(f) for f in sweep},
            "runs": rows,
            "planned": sum(1 for s in plan_study(study) if s.stage == "sweep" and s.arm == arm),
            "chosen": chosen,
            "chosen_at_edge": edges,
            # Held factors (spec.held_factors): kept at the arm's value, next to the value the
            # sweep would have picked (by gain over its own start for a start-changing factor).
            "held": {
                f: {"kept": chosen[f], "sweep_best": _best(study, arm, f, recs.get(arm, []))}
                for f in (held_factors(study, arm) if chosen else ())
            },
        }
    return out


def _targets_reached(rec: Mapping[str, Any], start_val: float, deltas: Sequence[float]) -> dict:
    """Per target (start + delta): the first validation evaluation at or above it, as (updates,
    rollouts, CPU seconds), or None."""
    out = {}
    for d in deltas:
        t = start_val + d
        hit = next((c for c in rec["curve"] if c[4] >= t - 1e-12), None)
        out[f"+{d:g}"] = (
            None
            if hit is None
            else {"target": t, "updates": hit[0], "rollouts": hit[1], "cpu_s": hit[2]}
        )
    return out


def build_report(study: Any) -> dict[str, Any]:
    """The study's report (module docstring): runs, starts, sweeps, per (task, arm) aggregates
    with hierarchical intervals, pairwise comparisons, time to targets, step ratios and the cost
    model."""
    specs = plan_study(study, choices(study))
    recs = [r for r in (collect(s, study.min_cpu_share) for s in specs) if r is not None]
    starts = {(r["task"], r["name"]): r for r in recs if r["stage"] == "start"}
    finals = [r for r in recs if r["stage"] == "final"]
    start_of = {}
    for s in specs:
        if s.stage == "final":
            start_of[(s.task, s.arm)] = next(
                (starts.get((s.task, os.path.basename(os.path.dirname(w)))) for w in s.after), None
            )
    aggregates: dict[str, dict[str, Any]] = {}
    for task in study.tasks:
        for arm in study.arms:
            rs = sorted(
                (r for r in finals if r["task"] == task and r["arm"] == arm),
                key=lambda r: r["seed"],
            )
            if not rs:
                continue
            start = start_of.get((task, arm))
            solved = [r["test_solved"] for r in rs if r["test_solved"]]
            agg: dict[str, Any] = {
                "seeds": [r["seed"] for r in rs],
                "test_acc": [r["test_acc"] for r in rs],
                "test_mean": float(np.mean([r["test_acc"] for r in rs])),
                "steps": [r["steps"] for r in rs],
                "rollouts": [r["rollouts"] for r in rs],
                "loop_cpu_s": [r["loop_cpu_s"] for r in rs],
                "peak_rss_mb": [r["peak_rss_mb"] for r in rs],
                "flags": {r["seed"]: r["flags"] for r in rs if r["flags"]},
            }
            if solved:
                agg["test_ci_hierarchical"] = stats.hierarchical_bootstrap(solved)
            if start is not None:
                agg["start"] = {
                    "workdir": start["workdir"],
                    "test_acc": start["test_acc"],
                    "validation_acc": start["validation_acc"],
                }
                if solved and start["test_solved"]:
                    agg["vs_start_hierarchical"] = stats.hierarchical_bootstrap(
                        solved, [start["test_solved"]]
                    )
                    agg["vs_start_mcnemar_per_seed"] = stats.per_seed_mcnemar(
                        solved, [start["test_solved"]] * len(solved)
                    )
                if start["validation_acc"] is not None:
                    agg["time_to_target"] = {
                        r["seed"]: _targets_reached(r, start["validation_acc"], study.targets)
                        for r in rs
                    }
            agg["pass_at_k_mean"] = _mean_dicts([r["pass_at_k"] for r in rs])
            aggregates.setdefault(task, {})[arm] = agg
    comparisons = []
    for task in study.tasks:
        for a, b in study.compare:
            ra = sorted((r for r in finals if r["task"] == task and r["arm"] == a), key=_seed)
            rb = sorted((r for r in finals if r["task"] == task and r["arm"] == b), key=_seed)
            sa = [r["test_solved"] for r in ra if r["test_solved"]]
            sb = [r["test_solved"] for r in rb if r["test_solved"]]
            if not sa or not sb:
                continue
            comp = {
                "task": task,
                "a": a,
                "b": b,
                "difference_hierarchical": stats.hierarchical_bootstrap(sa, sb),
                "difference_problems_only": stats.problem_bootstrap(sa, sb),
                "welch_seed_means": stats.seed_mean_test(
                    [r["test_acc"] for r in ra], [r["test_acc"] for r in rb]
                ),
            }
            if len(sa) == len(sb):
                comp["mcnemar_per_seed"] = stats.per_seed_mcnemar(sa, sb)
            comparisons.append(comp)
    return {
        "study": study.name,
        "budget_cpu_s": study.budget,
        "sweep_budget_cpu_s": study.sweep_budget,
        "seeds": list(study.seeds),
        "targets": list(study.targets),
        "starts": {f"{t}/{n}": _start_view(r) for (t, n), r in starts.items()},
        "sweeps": sweep_summary(study),
        "aggregates": aggregates,
        "comparisons": comparisons,
        "step_ratios": step_ratios(study, aggregates),
        "runs": recs,
        "flagged_runs": [r["workdir"] for r in recs if r["flags"]],
        "unfinished": [s.workdir for s in specs if not finished(s.workdir)],
    }


def _seed(r: Mapping[str, Any]) -> int:
    return r["seed"]


def _start_view(r: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "workdir": r["workdir"],
        "test_acc": r["test_acc"],
        "validation_acc": r["validation_acc"],
        "early_stopping": r["sft_early_stopping"],
        "overrides": r["overrides"],
    }


def _mean_dicts(ds: Sequence[Mapping[str, float]]) -> dict[str, float]:
    keys = set.intersection(*(set(d) for d in ds)) if ds else set()
    return {k: float(np.mean([d[k] for d in ds])) for k in sorted(keys)}


def step_ratios(study: Any, aggregates: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Per task and target: updates to the target of the gradient arm over the ES arm's (mean over
    the seeds that reached it; None when either never did), and the cost model's predicted
    speedups at 16 and 128 GPUs from that measured ratio (`compare_with_paper`, per-step times
    of the paper-scale configs from `study.scaling_results`)."""
    if len(study.step_ratio_arms) != 2:
        return {}
    es, grad = study.step_ratio_arms
    per_step = _paper_step_times(study.scaling_results)
    out: dict[str, Any] = {}
    for task, arms in aggregates.items():
        if es not in arms or grad not in arms:
            continue
        rows = {}
        for d in study.targets:
            key = f"+{d:g}"
            ue = _mean_reached(arms[es].get("time_to_target", {}), key)
            ug = _mean_reached(arms[grad].get("time_to_target", {}), key)
            row: dict[str, Any] = {"es_updates": ue, "grad_updates": ug}
            if ue and ug:
                row["step_ratio"] = ug["updates"] / ue["updates"]
                if per_step is not None:
                    from essa_jax.scaling import compare_with_paper

                    row["cost_model"] = compare_with_paper(
                        per_step["essa"], per_step["grpo_full"], step_ratio=row["step_ratio"]
                    )
            rows[key] = row
        out[task] = rows
    return out


def _mean_reached(ttt: Mapping[Any, Mapping[str, Any]], key: str) -> dict[str, Any] | None:
    hits = [v[key] for v in ttt.values() if v.get(key)]
    if not hits:
        return None
    return {
        "updates": float(np.mean([h["updates"] for h in hits])),
        "cpu_s": float(np.mean([h["cpu_s"] for h in hits])),
        "rollouts": float(np.mean([h["rollouts"] for h in hits])),
        "seeds_reached": len(hits),
        "seeds": len(ttt),
    }


def _paper_step_times(path: str) -> dict[str, dict[int, float]] | None:
    """{"essa": {gpus: s}, "grpo_full": {gpus: s}} of the cost model's rows in `path`."""
    if not path or not os.path.exists(path):
        return None
    rows = read_json(path).get("cost_model") or []
    if not rows:
        return None
    return {
        "essa": {int(r["gpus"]): float(r["essa_s"]) for r in rows},
        "grpo_full": {int(r["gpus"]): float(r["grpo_full_s"]) for r in rows},
    }


def _fmt(v: Any, spec: str = ".3f") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def format_tables(payload: Mapping[str, Any]) -> str:
    """The report's tables as text: starts, sweeps, final test accuracy per arm with its
    hierarchical interval (seeds, then problems), comparisons (hierarchical and problems-only
    intervals, Welch over seed means, per-seed McNemar p), time to targets and step ratios."""
    out = []
    for name, st in payload["starts"].items():
        es = st.get("early_stopping") or {}
        out.append(
            f"start {name}: validation {_fmt(st['validation_acc'])}, test {_fmt(st['test_acc'])}"
            + (f", best SFT step {es.get('best_step')} of {es.get('steps_run')}" if es else "")
        )
    for arm, sw in payload["sweeps"].items():
        out.append(
            f"sweep {arm} ({len(sw['runs'])}/{sw['planned']} runs): chosen {sw['chosen']}"
            + (f", at grid edge: {sw['chosen_at_edge']}" if sw["chosen_at_edge"] else "")
            + "".join(
                f"; {f} held at {h['kept']} (the sweep's best: {h['sweep_best']})"
                for f, h in (sw.get("held") or {}).items()
            )
        )
        for r in sw["runs"]:
            out.append(
                f"    {r['factor']}={r['value']}: validation {_fmt(r['validation_acc'])}"
                f" (its start {_fmt(r.get('start_validation_acc'))}; curve mean "
                f"{_fmt(r['curve_mean'])}, {r['steps']} updates)"
                + (" [grid extension]" if r.get("extension") else "")
            )
    out.append("")
    out.append(
        "final test accuracy, mean over seeds [95% hierarchical bootstrap: seeds, then "
        "problems]; per-seed values; updates; loop CPU s"
    )
    for task, arms in payload["aggregates"].items():
        for arm, a in arms.items():
            ci = a.get("test_ci_hierarchical") or {}
            vs = a.get("vs_start_hierarchical") or {}
            out.append(
                f"  {task:<12} {arm:<18} {_fmt(a['test_mean'])} [{_fmt(ci.get('low'))}, "
                f"{_fmt(ci.get('high'))}]  seeds {[round(x, 3) for x in a['test_acc']]}  "
                f"updates {a['steps']}  cpu {[round(x) for x in a['loop_cpu_s']]}"
                + (
                    f"  vs start {vs['estimate']:+.3f} [{vs['low']:+.3f}, {vs['high']:+.3f}]"
                    if vs
                    else ""
                )
                + (f"  FLAGGED {a['flags']}" if a["flags"] else "")
            )
    if payload["comparisons"]:
        out.append("")
        out.append(
            "differences a - b on test: hierarchical [seeds, problems] | problems only | "
            "Welch over seed means | exact McNemar p per seed"
        )
    for c in payload["comparisons"]:
        h, p, w = c["difference_hierarchical"], c["difference_problems_only"], c["welch_seed_means"]
        mc = [round(m["p_value"], 3) for m in c.get("mcnemar_per_seed", [])]
        out.append(
            f"  {c['task']:<12} {c['a']} - {c['b']}: {h['estimate']:+.3f} [{h['low']:+.3f}, "
            f"{h['high']:+.3f}] | [{p['low']:+.3f}, {p['high']:+.3f}] | t = {_fmt(w['t'], '.2f')},"
            f" df = {_fmt(w['df'], '.1f')}, p = {_fmt(w['p'], '.3f')} | {mc}"
        )
    for task, rows in payload.get("step_ratios", {}).items():
        out.append("")
        out.append(f"time to target on {task} (validation; mean over the seeds that reached it)")
        for key, r in rows.items():
            e, g = r["es_updates"], r["grad_updates"]

            def cell(x):
                if not x:
                    return "not reached"
                return (
                    f"{x['updates']:.0f} updates, {x['cpu_s']:.0f} CPU s "
                    f"({x['seeds_reached']}/{x['seeds']} seeds)"
                )

            cm = r.get("cost_model") or {}
            out.append(
                f"  {key}: ES {cell(e)}; gradient {cell(g)}"
                + (
                    f"; step ratio {r['step_ratio']:.2f} -> predicted speedup "
                    f"{cm.get('predicted_speedup_16', math.nan):.2f}x at 16 GPUs, "
                    f"{cm.get('predicted_speedup_128', math.nan):.2f}x at 128"
                    if cm
                    else ""
                )
            )
    return "\n".join(out)


def plot(payload: Mapping[str, Any], path: str) -> str:
    """Validation accuracy against loop CPU seconds and against updates, one line per final run
    (colour per arm), and each arm's final test accuracy with its hierarchical interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(payload["aggregates"])
    if not tasks:
        return ""
    fig, axes = plt.subplots(len(tasks), 3, figsize=(15, 4 * len(tasks)), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, task in enumerate(tasks):
        arms = list(payload["aggregates"][task])
        for r in payload["runs"]:
            if r["stage"] != "final" or r["task"] != task:
                continue
            col = colors[arms.index(r["arm"]) % len(colors)]
            xs_cpu = [c[2] for c in r["curve"]]
            xs_upd = [c[0] for c in r["curve"]]
            ys = [c[4] for c in r["curve"]]
            label = r["arm"] if r["seed"] == payload["seeds"][0] else None
            axes[row, 0].plot(xs_cpu, ys, color=col, marker="o", ms=3, label=label, alpha=0.8)
            axes[row, 1].plot(xs_upd, ys, color=col, marker="o", ms=3, alpha=0.8)
        for i, arm in enumerate(arms):
            a = payload["aggregates"][task][arm]
            ci = a.get("test_ci_hierarchical") or {}
            m = a["test_mean"]
            axes[row, 2].errorbar(
                [i],
                [m],
                yerr=[[m - ci.get("low", m)], [ci.get("high", m) - m]],
                color=colors[i % len(colors)],
                marker="o",
                capsize=4,
            )
            axes[row, 2].scatter([i] * len(a["test_acc"]), a["test_acc"], color="k", s=8)
        axes[row, 2].set_xticks(range(len(arms)), arms, rotation=20)
        axes[row, 0].set(xlabel="loop CPU seconds", ylabel="validation accuracy", title=task)
        axes[row, 1].set(xlabel="updates (generations / steps)", ylabel="validation accuracy")
        axes[row, 2].set(ylabel="test accuracy (mean, 95% hierarchical CI; dots: seeds)")
        axes[row, 0].legend(fontsize=8)
        for ax in axes[row]:
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
