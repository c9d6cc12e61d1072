"""Overlay runs: `python -m essa_jax.plot runs/` -> runs/compare.png (+ a printed table).

Every sub-folder of the given folder that holds a `metrics.jsonl` is one run (ESSA, GRPO, F-GRPO,
...); its train reward and held-out accuracy are drawn against loop wall-clock seconds and against
generated tokens, the axes every loop logs, so methods compare at equal cost.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from essa_jax.evaluation import pass_at_k_values
from essa_jax.train.metrics import METRICS_FILE


class PlotError(Exception):
    """A folder that holds nothing to plot (missing, no run with metrics, a damaged metrics
    file): `main` prints it as one line and exits 2."""


def read_rows(workdir: str, notes: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of `<workdir>/metrics.jsonl` (empty if missing). A last line cut short (a run
    still writing it, or killed mid-write) is skipped, with a note appended to `notes`; a bad
    line before the last is a damaged file: PlotError naming the file and the line."""
    path = os.path.join(workdir, METRICS_FILE)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [(i, ln) for i, ln in enumerate(f, 1) if ln.strip()]
    rows = []
    for k, (i, line) in enumerate(lines):
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif k == len(lines) - 1:
            if notes is not None:
                notes.append(
                    f"{path}: line {i} is incomplete (a run writing it, or one killed mid-write); "
                    "skipped"
                )
        else:
            raise PlotError(
                f"{path}: line {i} is not a JSON object: the file is damaged (a run writes one "
                "row per line)"
            )
    return rows


def find_runs(parent: str, notes: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """{run name: metric rows} for every sub-folder of `parent` with a metrics.jsonl, or for
    `parent` itself when it is one run's workdir (it holds metrics.jsonl). Notes on skipped
    incomplete lines go to `notes` (`read_rows`)."""
    if not os.path.isdir(parent):
        raise PlotError(f"{parent}: no such folder (a folder of runs, or one run's workdir)")
    if os.path.exists(os.path.join(parent, METRICS_FILE)):
        rows = read_rows(parent, notes)
        return {os.path.basename(os.path.abspath(parent)): rows} if rows else {}
    runs = {}
    for name in sorted(os.listdir(parent)):
        rows = read_rows(os.path.join(parent, name), notes)
        if rows:
            runs[name] = rows
    return runs


def _label(parent: str, name: str) -> str:
    path = os.path.join(parent, name, "config.json")
    try:
        with open(path) as f:
            method = json.load(f).get("method", "")
    except (OSError, ValueError):
        method = ""
    return f"{name} ({method})" if method and method not in name else name


def overlay(parent: str, out: str | None = None, notes: list[str] | None = None) -> str:
    """Draw every run of `parent` (a folder of runs, or one run's workdir) on shared axes; return
    the PNG path. Raises PlotError when there is nothing to draw; notes on skipped incomplete
    lines go to `notes`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = find_runs(parent, notes)
    if not runs:
        raise PlotError(
            f"{parent}: no run with metrics (no metrics.jsonl with a row in it or in a sub-folder; "
            "a run writes <workdir>/metrics.jsonl from its first step)"
        )
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for name, rows in runs.items():
        label = _label(parent, name)
        train = [r for r in rows if r.get("phase") == "train" and "reward" in r]
        ev = [r for r in rows if r.get("phase") == "eval" and "acc" in r]
        for col, axis in enumerate(("wall_s", "tokens")):
            if train:
                axes[0, col].plot(
                    [r[axis] for r in train], [r["reward"] for r in train], lw=1, label=label
                )
            if ev:
                axes[1, col].plot(
                    [r[axis] for r in ev], [r["acc"] for r in ev], marker="o", label=label
                )
    xlabels = ("training wall-clock (s)", "generated tokens")
    for col in range(2):
        axes[0, col].set(xlabel=xlabels[col], ylabel="train reward (mean)")
        axes[1, col].set(xlabel=xlabels[col], ylabel="held-out accuracy (greedy)")
        for row in range(2):
            axes[row, col].grid(alpha=0.3)
    axes[1, 0].legend(fontsize=8)
    fig.suptitle(f"runs in {parent}")
    fig.tight_layout()
    out = out or os.path.join(parent, "compare.png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def table(parent: str) -> list[dict[str, Any]]:
    """One row per run with a summary.json: method, held-out before / after, wall-clock, tokens."""
    rows = []
    runs = find_runs(parent)
    single = os.path.exists(os.path.join(parent, METRICS_FILE))
    for name in runs:
        path = os.path.join(parent, *([] if single else [name]), "summary.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            s = json.load(f)
        rows.append(
            {
                "run": name,
                "method": s["method"],
                "n": s["heldout_n"],
                "sft_acc": s["sft_heldout_acc"],
                "final_acc": s["final_heldout_acc"],
                "ci": "[{:.3f}, {:.3f}]".format(*s["final_heldout_ci"]),
                "wall_s": s["train_wall_seconds"],
                "tokens": s["generated_tokens"],
            }
        )
    return rows


def pass_at_k_curve(
    ax: Any,
    summary: dict[str, Any],
    label: str,
    *,
    color: Any = None,
    offset: float = 1.0,
) -> None:
    """pass@k against k (log-2 axis) of one summary (or any dict with "pass_at_<k>" entries), with
    its bootstrap intervals ("pass_at_<k>_ci") as error bars when present. `offset` multiplies
    k so that several methods' bars at the same k do not hide one another."""
    values = pass_at_k_values(summary)
    if not values:
        return
    ks = list(values)
    ys = [values[k] for k in ks]
    cis = [summary.get(f"pass_at_{k}_ci") for k in ks]
    xs = [k * offset for k in ks]
    if all(c is not None for c in cis):
        yerr = [
            [y - c[0] for y, c in zip(ys, cis, strict=True)],
            [c[1] - y for y, c in zip(ys, cis, strict=True)],
        ]
        ax.errorbar(xs, ys, yerr=yerr, marker="o", capsize=3, label=label, color=color)
    else:
        ax.plot(xs, ys, marker="o", label=label, color=color)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])


def _summaries(parent: str) -> dict[str, dict[str, Any]]:
    out = {}
    for name in sorted(os.listdir(parent)):
        path = os.path.join(parent, name, "summary.json")
        if os.path.exists(path):
            with open(path) as f:
                out[name] = json.load(f)
    return out


def compare(parent: str, json_out: str, png_out: str | None = None) -> dict[str, Any]:
    """Method comparison of the runs in `parent` (one per method, named by method) -> JSON + PNG.

    Fields: heldout_n, sft_heldout_acc (and its CI), <method>_heldout_acc / _ci, <method>_wall_s,
    <method>_tokens, <method>_pass_at_<k> for every k the runs measured (and its bootstrap interval
    <method>_pass_at_<k>_ci when the runs recorded one), and the paired test against the SFT start
    (<method>_paired_fixed / _paired_broken / _mcnemar_p) when the runs have it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sums = _summaries(parent)
    if not sums:
        raise FileNotFoundError(f"no summary.json under {parent}")
    first = next(iter(sums.values()))
    out: dict[str, Any] = {
        "heldout_n": first["heldout_n"],
        "sft_heldout_acc": first["sft_heldout_acc"],
        "sft_heldout_ci": first["sft_heldout_ci"],
    }
    for s in sums.values():
        m = s["method"]
        out[f"{m}_heldout_acc"] = s["final_heldout_acc"]
        out[f"{m}_heldout_ci"] = s["final_heldout_ci"]
        out[f"{m}_wall_s"] = s["train_wall_seconds"]
        out[f"{m}_tokens"] = s["generated_tokens"]
        out[f"{m}_steps"] = s["steps"]
        for k, v in s.items():
            if k.startswith("pass_at_") or k in ("paired_fixed", "paired_broken", "mcnemar_p"):
                out[f"{m}_{k}"] = v
    os.makedirs(os.path.dirname(os.path.abspath(json_out)), exist_ok=True)
    with open(json_out, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    runs = find_runs(parent)
    for name, s in sums.items():
        ev = [r for r in runs.get(name, []) if r["phase"] == "eval"]
        axes[0].plot(
            [r["wall_s"] for r in ev], [r["acc"] for r in ev], marker="o", label=s["method"]
        )
        pass_at_k_curve(axes[1], s, s["method"])
    axes[0].set(xlabel="training wall-clock (s)", ylabel="held-out accuracy (greedy)")
    axes[1].set(xlabel="k", ylabel="held-out pass@k (T = 1)", title="after training")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    png_out = png_out or os.path.splitext(json_out)[0] + ".png"
    fig.savefig(png_out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m essa_jax.plot FOLDER [--json results.json]`: 0 with the plot written; 2 with one
    line on stderr when the folder is missing, holds no run with metrics or a damaged metrics
    file (a last line cut short is skipped with a one-line note, and the plot still made)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--json"):
        print(
            "error: usage: python -m essa_jax.plot <folder of runs | a run's workdir> "
            "[--json results.json]",
            file=sys.stderr,
        )
        return 2
    parent = argv[0]
    notes: list[str] = []
    try:
        path = overlay(parent, notes=notes)
        if len(argv) == 3:
            res = compare(parent, argv[2])
            print(json.dumps(res, indent=2))
    except (PlotError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    rows = table(parent)
    if rows:
        cols = list(rows[0])
        fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
        widths = [max(len(c), *(len(fmt(r[c])) for r in rows)) for c in cols]
        print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
        for r in rows:
            print("  ".join(fmt(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
