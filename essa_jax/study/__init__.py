"""Studies: a set of configs x tasks x seeds with an equal-effort sweep, run resumably one process
per core, archived, and reported with intervals over seeds and problems (docs/STUDIES.md).

    python -m essa_jax.study --study experiments/studies/fair_verdict.py --dry_run
    nohup python -m essa_jax.study --study ... --jobs 2 > runs/study.log 2>&1 &
    python -m essa_jax.study --study ... --report_only
"""

from essa_jax.study.report import build_report, choices, collect
from essa_jax.study.runner import run_study, schedule, sync_records
from essa_jax.study.spec import RunSpec, check_equal_effort, load_study, plan_study
from essa_jax.study.stats import (
    hierarchical_bootstrap,
    per_seed_mcnemar,
    problem_bootstrap,
    seed_mean_test,
    time_to_target,
)

__all__ = [
    "RunSpec",
    "build_report",
    "check_equal_effort",
    "choices",
    "collect",
    "hierarchical_bootstrap",
    "load_study",
    "per_seed_mcnemar",
    "plan_study",
    "problem_bootstrap",
    "run_study",
    "schedule",
    "seed_mean_test",
    "sync_records",
    "time_to_target",
]
