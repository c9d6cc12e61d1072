#!/usr/bin/env bash
# Controlled ablations of the default ESSA run on SmolLM2-135M (see experiments/ablate_smollm2.py):
# every cell = the default with one setting changed, the same rollout budget, seeds 0 and 1 of the
# search from one SFT adapter. Resumable: finished runs are not re-run.
#
#   experiments/ablate_smollm2.sh                 # ~24 runs x (load + SFT + 12 generations + evals)
#   ROLLOUTS=3072 SEEDS="0 1" CELLS="default plain" experiments/ablate_smollm2.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PY=${PY:-.venv/bin/python}
# Runs of one cell share shapes: XLA's persistent cache saves most of each run's compile time.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-runs/ablate_smollm2/jax_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-1}
exec "$PY" experiments/ablate_smollm2.py "$@"
