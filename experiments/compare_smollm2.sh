#!/usr/bin/env bash
# ESSA vs GRPO vs F-GRPO on SmolLM2-135M-Instruct, 2-digit addition (prefilled), equal wall-clock.
#
# Each method starts from the same SFT adapter (same seed and SFT settings) and trains until
# BUDGET seconds of loop wall-clock (max_wall_seconds; SFT and held-out evaluations excluded).
# Then: greedy held-out accuracy and pass@k (16 samples, k = 1..16) of every final policy.
# Writes experiments/results/compare_smollm2.json and .png, and runs/compare_smollm2/compare.png.
#
#   BUDGET=600 experiments/compare_smollm2.sh          # ~3 x (load + SFT + 10 min + evals)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
BUDGET=${BUDGET:-600}
OUT=${OUT:-runs/compare_smollm2}
RESULTS=${RESULTS:-experiments/results/compare_smollm2.json}

for method in essa grpo fgrpo; do
  "$PY" -m essa_jax.main \
    --config "experiments/configs/${method}_smollm2_arith.py" \
    --workdir "$OUT/$method" \
    --config.max_wall_seconds="$BUDGET" \
    --config.essa.generations=100000 \
    --config.grpo.steps=100000 \
    --config.eval.every=10 \
    --config.eval.pass_k_samples=16 \
    --config.eval.pass_k="(1, 2, 4, 8, 16)" \
    --config.eval.pass_k_problems=50
done
"$PY" -m essa_jax.plot "$OUT" --json "$RESULTS"
