"""The end of a run: summary table (printed + summary.json) and PNG plots against wall-clock."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from essa_jax.evaluation import mcnemar_exact, pass_at_k_values

SUMMARY_FILE = "summary.json"


def make_summary(
    config, meta: dict, final: dict, pass_k: dict, validation: dict | None = None
) -> dict[str, Any]:
    """Held-out accuracy before (SFT) / after with n and 95% CI, wall-clock, tokens, pass@k (with
    `pass_at_<k>_ci` bootstrap intervals and per-problem `pass_correct` when measured).

    With a validation split, `validation` is the final policy's validation evaluation
    (`final_validation_acc`); `final` is the test evaluation, or `validation` itself when the run
    did not read test (`eval.read_test` False: `final_split` says "validation" and the before /
    after fields compare the SFT start's and the final policy's validation scores)."""
    split = "validation" if validation is not None and final is validation else "test"
    sft = meta["sft_validation_eval"] if split == "validation" else meta["sft_eval"]
    train_rows = [r for r in meta["history"] if r["phase"] == "train"]
    out = {
        "method": config.method,
        "model": config.model.path,
        "task": config.task.name,
        "final_split": split,
        "heldout_n": final["n"],
        "sft_heldout_acc": sft["acc"],
        "sft_heldout_ci": [sft["ci_low"], sft["ci_high"]],
        "final_heldout_acc": final["acc"],
        "final_heldout_ci": [final["ci_low"], final["ci_high"]],
        "steps": train_rows[-1]["step"] if train_rows else 0,
        "sft_seconds": meta["sft_seconds"],
        "train_wall_seconds": meta["wall_s"],
        "generated_tokens": meta["tokens"],
        "rollouts": meta.get("rollouts", 0),  # completions the loop generated
        # The loop's CPU seconds in this process (max_cpu_seconds' clock) and the host's 1-minute
        # load average when the loop started: a run that shared its core is visible here.
        "train_cpu_seconds": meta.get("cpu_s", 0.0),
        "load_at_start": meta.get("load_at_start"),
    }
    if validation is not None:
        out["final_validation_acc"] = validation["acc"]
        out["final_validation_solved"] = validation.get("solved")
    if meta.get("sft_validation_eval"):
        out["sft_validation_acc"] = meta["sft_validation_eval"]["acc"]
    if meta.get("sft_validation"):
        out["sft_early_stopping"] = meta["sft_validation"]
    if meta.get("sft_init_from"):
        out["sft_init_from"] = meta["sft_init_from"]
    if meta.get("base_eval"):
        out["base_heldout_acc"] = meta["base_eval"]["acc"]
    before, after = sft.get("solved"), final.get("solved")
    if before and after and len(before) == len(after):
        # Same problems before and after: a paired test says more than two overlapping CIs.
        paired = mcnemar_exact([int(ch) for ch in before], [int(ch) for ch in after])
        out["paired_fixed"], out["paired_broken"] = paired["fixed"], paired["broken"]
        out["mcnemar_p"] = paired["p_value"]
    out.update(pass_k)
    return out


def format_summary(s: dict[str, Any]) -> str:
    def ci(c: Sequence[float]) -> str:
        return f"[{c[0]:.3f}, {c[1]:.3f}]"

    rows = [
        ("method", s["method"]),
        ("model / task", f"{s['model']} / {s['task']}"),
        ("held-out problems (n)", str(s["heldout_n"])),
        (
            "held-out acc, SFT (before)",
            f"{s['sft_heldout_acc']:.3f}  95% CI {ci(s['sft_heldout_ci'])}",
        ),
        (
            "held-out acc, final (after)",
            f"{s['final_heldout_acc']:.3f}  95% CI {ci(s['final_heldout_ci'])}",
        ),
        ("steps", str(s["steps"])),
        ("SFT seconds", f"{s['sft_seconds']:.1f}"),
        ("training wall-clock seconds", f"{s['train_wall_seconds']:.1f}"),
        ("generated tokens", str(s["generated_tokens"])),
    ]
    if "mcnemar_p" in s:
        rows.insert(
            5,
            (
                "paired vs SFT",
                f"{s['paired_fixed']} fixed, {s['paired_broken']} broken, "
                f"exact McNemar p = {s['mcnemar_p']:.2g}",
            ),
        )
    if "base_heldout_acc" in s:
        rows.insert(3, ("held-out acc, base model", f"{s['base_heldout_acc']:.3f}"))
    for k, v in pass_at_k_values(s).items():
        ci_k = s.get(f"pass_at_{k}_ci")  # the bootstrap interval over problems, when recorded
        rows.append((f"pass@{k}", f"{v:.3f}" + (f"  95% CI {ci(ci_k)}" if ci_k else "")))
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(w)}  {v}" for k, v in rows)


def write_summary(workdir: str, summary: dict[str, Any], *, verbose: bool = True) -> str:
    from essa_jax.workdir import write_text_atomic

    path = os.path.join(workdir, SUMMARY_FILE)
    write_text_atomic(path, json.dumps(summary, indent=2) + "\n")  # never a half-written file
    if verbose:
        print("\n" + format_summary(summary) + f"\n(written to {path})", flush=True)
    return path


def plot_run(workdir: str, history: list[dict[str, Any]], title: str = "") -> str:
    """reward and held-out accuracy against loop wall-clock -> `<workdir>/curves.png`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in history if r["phase"] == "train"]
    ev = [r for r in history if r["phase"] == "eval"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    axes[0].plot([r["wall_s"] for r in train], [r["reward"] for r in train], lw=1)
    axes[0].set(xlabel="wall-clock (s)", ylabel="train reward (mean)", title="reward")
    if ev:
        x = [r["wall_s"] for r in ev]
        axes[1].errorbar(
            x,
            [r["acc"] for r in ev],
            yerr=[
                [r["acc"] - r["ci_low"] for r in ev],
                [r["ci_high"] - r["acc"] for r in ev],
            ],
            marker="o",
            capsize=3,
        )
    axes[1].set(xlabel="wall-clock (s)", ylabel="held-out accuracy", title="held-out (95% CI)")
    for ax in axes:
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = os.path.join(workdir, "curves.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
