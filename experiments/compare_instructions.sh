#!/usr/bin/env bash
# ESSA beyond math (issue #33): base -> SFT -> ESSA and -> GRPO on the generated instruction task,
# SmolLM2-135M, equal loop wall-clock, SEEDS search seeds, every model scored through lm-eval's
# IFEval checkers with per-instruction-type accuracy. The plan, its time estimate and the outputs
# are in experiments/compare_instructions.py's docstring.
#
# Resumable: a finished run (summary.json) or evaluation (lm_eval.json) is not redone, an
# interrupted run resumes from its last checkpoint. One run at a time on every core, or (JOBS=2) a
# seed's ESSA and GRPO runs side by side, one core each; start it in the background:
#
#   nohup experiments/compare_instructions.sh > runs/compare_instructions.log 2>&1 &
#   JOBS=2 nohup experiments/compare_instructions.sh > runs/compare_instructions.log 2>&1 &
#
#   experiments/compare_instructions.sh --dry_run       # the commands, nothing run
#   SEEDS="0 1 2 3" WALL=3600 experiments/compare_instructions.sh
#   experiments/compare_instructions.sh --report_only   # experiments/results/compare_instructions.json
#
# Variables: JOBS (1), SEEDS ("0 1 2"), WALL (1800 s of loop wall-clock per ESSA / GRPO run), OUT
# (runs/compare_instructions), ARCHIVE (experiments/results/compare_instructions_runs; '' = off),
# RESULTS, PY. Needs the lmeval extra: pip install -e '.[lmeval]'.
set -euo pipefail
cd "$(dirname "$0")/.."
export PY=${PY:-.venv/bin/python}
# Each evaluated run's record is copied here (commit it) and restored from it before planning.
export ARCHIVE=${ARCHIVE-experiments/results/compare_instructions_runs}
# Runs of one task share shapes: XLA's persistent cache saves most of each run's compile time.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-runs/compare_instructions/jax_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-1}
exec "$PY" experiments/compare_instructions.py "$@"
