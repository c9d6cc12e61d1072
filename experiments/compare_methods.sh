#!/usr/bin/env bash
# ESSA vs full-parameter GRPO (and LoRA GRPO, full-parameter F-GRPO, SVD-GRPO) on SmolLM2-135M at
# equal loop wall-clock (WALL = 900 s), 3 search seeds, add_2d and the probe's hard task, from one
# SFT start per task (issue #32). The plan, its learning-rate sweep, the report and the time
# estimate are in experiments/compare_methods.py's docstring.
#
# Resumable: a finished run (summary.json) is not re-run, an interrupted one resumes from its last
# checkpoint; runs started at another commit are refused (--allow_commit_mix). Each finished run's
# record (summary.json, metrics.jsonl, run_record.json: small text) is copied to ARCHIVE
# (experiments/results/compare_methods_runs) and restored from it into OUT before planning: commit
# ARCHIVE as runs finish, and a later session resumes from a worktree at the runs' commit
# (`git worktree add W <commit>`, then copy experiments/results/compare_methods_runs into W's)
# without re-running them; an interrupted run's checkpoints die with its session. Each run is pinned
# to one core; on the 2-core machine run two at a time in the background:
#
#   experiments/compare_methods.sh --dry_run                       # every run, command, estimate
#   nohup experiments/compare_methods.sh --jobs 2 > runs/compare_methods.log 2>&1 &
#   experiments/compare_methods.sh --report_only                   # the report from what is done
#
# Variables: TASKS ("add_2d hard"), METHODS, SEEDS ("0 1 2"), WALL (900), EVAL_SECONDS (150),
# PASS_SAMPLES (64), PASS_PROBLEMS (20), FULL_LRS, LORA_LRS, JOBS (1), FIRST_CORE (0),
# OUT (runs/compare_methods), ARCHIVE, OUT_JSON (experiments/results/compare_methods.json),
# PROBE_RESULTS, PY.
set -euo pipefail
cd "$(dirname "$0")/.."
export PY=${PY:-.venv/bin/python}
export ARCHIVE=${ARCHIVE-experiments/results/compare_methods_runs}
exec "$PY" experiments/compare_methods.py "$@"
