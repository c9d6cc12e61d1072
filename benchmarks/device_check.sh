#!/usr/bin/env bash
# The device check (benchmarks/device_check.py) on a machine with one NVIDIA GPU and a preinstalled
# JAX with CUDA: nothing is installed. Run from anywhere:
#
#   benchmarks/device_check.sh                      # Qwen2.5-1.5B shape, writes experiments/results/gpu.json
#   benchmarks/device_check.sh --model Qwen2.5-7B   # any shape of essa_jax/models/shapes.py
#   benchmarks/device_check.sh --smoke --out /tmp/gpu.json   # tiny shapes, CPU is fine (CI)
#
# Besides jax, jaxlib (CUDA) and numpy, the imported code needs these packages (what
# `import essa_jax.models, essa_jax.lora, essa_jax.population` loads); a machine that lacks them
# gets them as wheels in $ESSA_WHEELS (default: wheels/ at the repository root), each put on
# PYTHONPATH as it is (a pure-Python wheel imports from its zip; no pip):
#   pure Python: flax, optax, qwix, treescope, etils, absl-py, rich, Pygments, markdown-it-py,
#                mdurl, typing_extensions, filelock, opt_einsum, ml_dtypes comes with jax;
#   with an optional C extension, whose pure-Python fallback then loads: PyYAML, msgpack.
# Make them here with: .venv/bin/pip download --no-deps -d wheels flax optax qwix treescope etils \
#   absl-py rich pygments markdown-it-py mdurl typing_extensions filelock opt_einsum pyyaml msgpack
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
wheels="${ESSA_WHEELS:-$root/wheels}"
path="$root"
if [ -d "$wheels" ]; then
  for w in "$wheels"/*.whl; do
    [ -e "$w" ] && path="$path:$w"
  done
fi
export PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}"
export MSGPACK_PUREPYTHON="${MSGPACK_PUREPYTHON:-1}"
cd "$root"
exec "${PYTHON:-python3}" -m benchmarks.device_check "$@"
