"""The fair verdict (issue #41): ESSA against full-parameter GRPO, full-parameter F-GRPO and LoRA
GRPO, tuned with equal effort on a validation split, from a converged SFT start, at the ESSA
paper's proportions where a CPU allows, 3 search seeds, budgets in the process's own CPU seconds.

Protocol (docs/STUDIES.md):
- splits: train / validation (200) / test (the 200 held-out problems #32 reported on), disjoint
  up to swapped operands (essa_jax.data.canonical_key); validation for early stopping and tuning,
  test read once per final run.
- starts: "converged" = LoRA rank 8 (the paper's), SFT early-stopped on validation within one
  epoch; every arm of a task starts from it (full-parameter arms from it folded into the weights).
  "short" = #32's 2-step SFT, on sub_2d only, for continuity.
- tuning: 8 sweep runs per arm (sweep_runs), one factor at a time around the arm's settings, 600
  CPU seconds each on sub_2d, seed 0, chosen on final validation accuracy (ties: the higher mean
  validation curve); a choice at the edge of a numeric grid is flagged in the report. A factor
  that changes the SFT start (rank) is scored by its gain over its own start and not carried into
  the finals (every arm of a task starts from the identical rank-8 model); ESSA's population x
  prompts and alpha are held at the issue's floor (item 3) and reported (DECISIONS.md).
  ESSA: sigma_0 {0.03, 0.1, 0.3, 1} (relative to each SFT singular value), population x
  prompts per candidate at 768 rollouts per generation {24 x 32, 48 x 16, 96 x 8}, alpha
  {0.25, 1}, rank {4, 8}. Why 768 and not the issue's 1 536: a rollout costs ~0.1 CPU s here
  (32 prompt + 5 answer tokens of a 135M model on one core, near its matmul bound; fair_probe:
  256 rollouts per 27 s generation), so 1 536 rollouts is ~160 s per generation and a 600 s sweep
  run would see 3-4 generations. 24 x 32 is the issue's floor (population >= 24, >= 32 prompts
  per candidate); 48 x 16 and 96 x 8 are swept and reported, the finals stay at 24 x 32.
  Gradient arms: learning rate (5-6 values bracketing the #32 choice) and group size / gamma.
  A choice at a grid's edge is bracketed by one extension run beyond it ("extend": LoRA GRPO
  lr 1e-5, full GRPO G2), counted apart from the 8 (it can only help the gradient arm).
- final runs: 2 400 CPU seconds of loop each: ~30 ESSA generations at 24 x 32 (~80 s each), not
  the >= 100 the issue asks for: 100 would take ~8 000 CPU s per run, and a full-parameter run
  cannot outlive a session here (its 1.6 GB checkpoints are not kept), so every arm gets 2 400 s.
  validation every 300 s, pass@k from 64 samples on 20 test problems.
- targets fixed before the runs: the start's validation accuracy + 0.05 / 0.10 / 0.15.

    python -m essa_jax.study --study experiments/studies/fair_verdict.py --dry_run
    nohup python -m essa_jax.study --study experiments/studies/fair_verdict.py --jobs 2 \
        > runs/fair_verdict.log 2>&1 &
"""

UNBOUNDED = 1_000_000  # generations / steps: the CPU budget ends the loop
ESSA = "experiments/configs/essa_smollm2_arith.py"
GRPO = "experiments/configs/grpo_smollm2_arith.py"
FGRPO = "experiments/configs/fgrpo_smollm2_arith.py"
FULL = {"grpo.steps": UNBOUNDED, "train.params": "full", "train.sft_params": "lora"}
RANK8 = {"lora.rank": 8, "lora.alpha": 16.0}  # the paper's rank, the same alpha / r = 2


def get_study():
    return {
        "name": "fair_verdict",
        "out": "runs/fair_verdict",
        "archive": "experiments/results/fair_verdict_runs",
        "results": "experiments/results/fair_verdict.json",
        "seeds": (0, 1, 2),
        "budget": 2400.0,
        "sweep_budget": 600.0,
        "eval_seconds": 300.0,
        "num_validation": 200,
        "sweep_task": "sub_2d",
        "sweep_runs": 8,
        "common": {
            "eval.base_model": False,
            "eval.pass_k_samples": 64,
            "eval.pass_k": (1, 2, 4, 8, 16, 32, 64),
            "eval.pass_k_problems": 20,
            "checkpoint.every": 20,
            "checkpoint.keep": 1,
        },
        "tasks": {
            "sub_2d": {
                "task.name": "sub_2d",
                "task.prompt_format": "prefill",
                "generation.max_new_tokens": 5,
            },
            # Level-1 expressions (+, - of 3 operands 1..9). Level 2 (arith_mixed: +, -, * of 3-4
            # operands up to 12) was dropped before its finals: its converged start does not
            # learn (best validation 0.04 at SFT step 10 = the base model's), DECISIONS.md.
            "arith_mixed_l1": {
                "task.name": "arith_mixed_l1",
                "task.prompt_format": "prefill",
                "generation.max_new_tokens": 5,
            },
        },
        "starts": {
            "converged_r8": {
                "config": ESSA,
                "overrides": {
                    **RANK8,
                    "sft.steps": 125,  # one epoch of 2000 problems at batch 16
                    "sft.eval_every": 10,
                    "sft.patience": 3,
                    "checkpoint.every": 0,
                    "eval.pass_k_samples": 64,
                    "eval.pass_k": (1, 2, 4, 8, 16, 32, 64),
                    "eval.pass_k_problems": 20,
                },
            },
            "short": {"config": ESSA, "overrides": {"sft.steps": 2, "checkpoint.every": 0}},
        },
        "arms": {
            "essa": {
                "config": ESSA,
                "start": "converged_r8",
                "overrides": {
                    **RANK8,
                    "essa.generations": UNBOUNDED,
                    "essa.alpha": 1.0,
                    # The schema's default; #32's 2.0 was tuned on a 2-step start, whose
                    # singular values are tiny: from a converged start it collapses (fair_probe).
                    "essa.sigma_init": 0.1,
                    "essa.population_size": 24,
                    "essa.prompts_per_candidate": 32,
                },
                "sweep": {
                    "essa.sigma_init": (0.03, 0.1, 0.3, 1.0),
                    "essa.population_size,essa.prompts_per_candidate": (
                        (24, 32),
                        (48, 16),
                        (96, 8),
                    ),
                    "essa.alpha": (0.25, 1.0),
                    "lora.rank,lora.alpha": ((4, 8.0), (8, 16.0)),
                },
                # The item 3 fixes the final ESSA at the paper's proportions (population
                # >= 24, >= 32 prompts per candidate, alpha 1, rank 8): swept and reported, not
                # chosen (DECISIONS.md, 2026-12-07: the sweep's alternatives led by one problem
                # of 200). Rank is held anyway: it changes the SFT start (hold_start).
                "hold": (
                    "essa.population_size,essa.prompts_per_candidate",
                    "essa.alpha",
                    "lora.rank,lora.alpha",
                ),
            },
            "grpo_full": {
                "config": GRPO,
                "start": "converged_r8",
                "overrides": {**RANK8, **FULL, "grpo.learning_rate": 1e-5},
                "sweep": {
                    "grpo.learning_rate": (3e-7, 1e-6, 3e-6, 1e-5, 3e-5, 1e-4),
                    "grpo.group_size": (4, 8, 16),
                },
                # G4 was chosen at the grid's edge: bracketed below (DECISIONS.md, 2026-12-07).
                "extend": {"grpo.group_size": (2,)},
            },
            "fgrpo_full": {
                "config": FGRPO,
                "start": "converged_r8",
                "overrides": {**RANK8, **FULL, "grpo.learning_rate": 1e-5},
                "sweep": {
                    "grpo.learning_rate": (3e-7, 1e-6, 3e-6, 1e-5, 3e-5, 1e-4),
                    "grpo.focal_gamma": (0.25, 0.5, 1.0),
                },
            },
            "grpo_lora": {
                "config": GRPO,
                "start": "converged_r8",
                "overrides": {**RANK8, "grpo.steps": UNBOUNDED, "grpo.learning_rate": 3e-4},
                "sweep": {
                    "grpo.learning_rate": (3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2),
                    "grpo.group_size": (4, 8, 16),
                },
                # lr 3e-5 was chosen at the grid's edge: bracketed below (DECISIONS.md).
                "extend": {"grpo.learning_rate": (1e-5,)},
            },
            # #32's short start, sub_2d only, at the arms' chosen settings of today's rank 4.
            "essa_short": {
                "config": ESSA,
                "start": "short",
                "tasks": ("sub_2d",),
                "overrides": {"essa.generations": UNBOUNDED},
            },
            "grpo_full_short": {
                "config": GRPO,
                "start": "short",
                "tasks": ("sub_2d",),
                "overrides": {**FULL, "grpo.learning_rate": 1e-5},
            },
        },
        "compare": (
            ("essa", "grpo_full"),
            ("essa", "fgrpo_full"),
            ("essa", "grpo_lora"),
            ("fgrpo_full", "grpo_full"),
            ("essa_short", "grpo_full_short"),
        ),
        "step_ratio_arms": ("essa", "grpo_full"),
    }
