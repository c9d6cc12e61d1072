"""The fair verdict's first probe (issue #41): the cheapest test of the largest bias.

ESSA and full-parameter GRPO at today's settings (#32's: ESSA 16 x 16, sigma_0 2, alpha 0.25,
mirrored; full GRPO AdamW lr 1e-5 from #32's sweep), but from a *converged* SFT start (early-stopped
on a validation split, at most one epoch) instead of #32's 2-step one; 3 search seeds; 900 CPU
seconds of loop per run (the process's own CPU time on its pinned core); validation every 150 s;
the test set (the same 200 held-out problems as #32) read once per run.

    python -m essa_jax.study --study experiments/studies/fair_probe.py --dry_run
    nohup python -m essa_jax.study --study experiments/studies/fair_probe.py --jobs 2 \
        > runs/fair_probe.log 2>&1 &
"""

UNBOUNDED = 1_000_000  # generations / steps: the CPU budget ends the loop
ESSA = "experiments/configs/essa_smollm2_arith.py"
GRPO = "experiments/configs/grpo_smollm2_arith.py"


def get_study():
    s: dict = {}
    s["name"] = "fair_probe"
    s["out"] = "runs/fair_verdict"  # shared with the full study: one converged start per task
    s["archive"] = "experiments/results/fair_verdict_runs"
    s["results"] = "experiments/results/fair_probe.json"
    s["seeds"] = (0, 1, 2)
    s["budget"] = 900.0
    s["eval_seconds"] = 150.0
    s["num_validation"] = 200
    s["common"] = {
        "eval.base_model": False,
        "eval.pass_k_samples": 64,
        "eval.pass_k": (1, 2, 4, 8, 16, 32, 64),
        "eval.pass_k_problems": 20,
        # A stopped run loses at most 20 steps; one kept (a full-parameter one is 1.6 GB).
        "checkpoint.every": 20,
        "checkpoint.keep": 1,
    }
    # Greedy answers of up to 3 digits + EOS; 5 tokens for every method (compare_methods' TASKS).
    s["tasks"] = {
        "sub_2d": {
            "task.name": "sub_2d",
            "task.prompt_format": "prefill",
            "generation.max_new_tokens": 5,
        },
    }
    s["starts"] = {
        # One epoch of 2000 problems at batch 16 at most; validation every 10 steps; stop after
        # 3 evaluations without a new best; the best is kept.
        "converged": {
            "config": ESSA,
            "overrides": {
                "sft.steps": 125,
                "sft.eval_every": 10,
                "sft.patience": 3,
                "checkpoint.every": 0,
            },
        },
    }
    # Order matters: final runs go seed-major in this order, so a probe cut short has the two
    # re-set arms at seeds 0 and 1 and today's arms at seed 0 (the most informative runs first).
    # The first attempt's records (2026-12-06, commit cccedaa..5c7ca6b) were lost with that
    # session's machine before they were archived; every run here was re-run from one commit.
    s["arms"] = {
        # Declared 2026-12-06 23:36 UTC, after essa_today seed 0 / 1 had collapsed (0.56 -> 0.02 on
        # test: sigma_0 = 2 relative to each singular value was tuned on a 2-step start) and before
        # any run of this arm: the schema's default sigma_0 = 0.1, everything else as essa_today.
        "essa_sigma01": {
            "config": ESSA,
            "start": "converged",
            "seeds": (0, 1),
            "overrides": {"essa.generations": UNBOUNDED, "essa.sigma_init": 0.1},
        },
        # Declared 2026-12-06 23:44 UTC, when grpo_full_today seed 0 had fallen from 0.575 to
        # 0.235-0.36 on validation, before any run of this arm: one step down #32's grid
        # (3e-6, tied with 1e-5 there: 0.73 vs 0.735), the same effort as essa_sigma01.
        "grpo_full_lr3e-6": {
            "config": GRPO,
            "start": "converged",
            "seeds": (0, 1),
            "overrides": {
                "grpo.steps": UNBOUNDED,
                "train.params": "full",
                "train.sft_params": "lora",
                "grpo.learning_rate": 3e-6,
            },
        },
        "essa_today": {
            "config": ESSA,
            "start": "converged",
            "overrides": {"essa.generations": UNBOUNDED},
        },
        "grpo_full_today": {
            "config": GRPO,
            "start": "converged",
            "overrides": {
                "grpo.steps": UNBOUNDED,
                "train.params": "full",
                "train.sft_params": "lora",
                "grpo.learning_rate": 1e-5,
            },
        },
    }
    s["compare"] = (
        ("essa_today", "grpo_full_today"),
        ("essa_sigma01", "grpo_full_lr3e-6"),
        ("essa_sigma01", "grpo_full_today"),
    )
    s["step_ratio_arms"] = ("essa_today", "grpo_full_today")
    return s
