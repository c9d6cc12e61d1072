#!/usr/bin/env bash
# GRPO vs F-GRPO (focal, arXiv 2602.06717) on SmolLM2-135M from one SFT start, pass@k up to 64 with
# bootstrap intervals over 200 held-out problems, and the paper's training diagnostics (issue #21).
# The logic, the plan and its time estimate are in experiments/compare_fgrpo.py's docstring.
#
# Resumable: a finished run (summary.json) is not re-run, an interrupted one resumes from its last
# checkpoint. One run at a time; on the 2-core machine start it in the background:
#
#   nohup experiments/compare_fgrpo.sh > runs/compare_fgrpo.log 2>&1 &
#
#   experiments/compare_fgrpo.sh --probe       # candidates' SFT-start pass@1 / pass@64 (~17 min)
#   experiments/compare_fgrpo.sh               # probe if missing; sft grpo fgrpo on its task (~1.4 h)
#   TASK=sub_2d METHODS="sft grpo fgrpo fgrpo_g1" experiments/compare_fgrpo.sh    # + gamma 1 (~1.8 h)
#   SEEDS="0 1" METHODS="sft grpo fgrpo dapo fdapo cispo fcispo" experiments/compare_fgrpo.sh
#   experiments/compare_fgrpo.sh --dry_run     # the commands and the estimate, nothing run
#
# Variables: TASK (auto = the probe's recommendation; sub_2d arith_mixed word_problems add_2d),
# METHODS, SEEDS, STEPS (150), EVAL_EVERY (25), PASS_SAMPLES (64), PASS_PROBLEMS (200),
# PROBE_TASKS, PROBE_PROBLEMS (50), OUT (runs/compare_fgrpo), RESULTS, PROBE_RESULTS, PY.
# Writes experiments/results/compare_fgrpo_probe.json, compare_fgrpo.json and compare_fgrpo.png.
set -euo pipefail
cd "$(dirname "$0")/.."
export PY=${PY:-.venv/bin/python}
# Runs of one task share shapes: XLA's persistent cache saves most of each run's compile time.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-runs/compare_fgrpo/jax_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-1}
exec "$PY" experiments/compare_fgrpo.py "$@"
