#!/usr/bin/env bash
# The device check (benchmarks/device_check.py) on a machine with one NVIDIA GPU and a preinstalled
# JAX with CUDA: nothing is installed. Run from anywhere:
#
#   benchmarks/device_check.sh                      # Qwen2.5-1.5B shape, writes experiments/results/gpu.json
#   benchmarks/device_check.sh --model Qwen2.5-7B   # any shape of essa_jax/models/shapes.py
#   benchmarks/device_check.sh --smoke               # tiny shapes, CPU is fine (CI); writes
#                                                   # $TMPDIR/essa_jax_device_check_smoke.json
#
# Besides jax, jaxlib (CUDA) and numpy, the imported code needs these packages (what
# `import essa_jax.models, essa_jax.lora, essa_jax.population` loads); a machine that lacks them
# gets them as wheels in $ESSA_WHEELS (default: wheels/ at the repository root), unpacked into a
# fresh temporary folder that goes on PYTHONPATH (no pip; not imported from the zips, because
# zipimport cannot load namespace packages such as qwix._src):
#   pure Python: flax, optax, qwix, treescope, etils, absl-py, rich, Pygments, markdown-it-py,
#                mdurl, typing_extensions, filelock, opt_einsum, ml_dtypes comes with jax;
#   with an optional C extension, whose pure-Python fallback then loads: PyYAML, msgpack.
# Make them here for the target's Python (JAX 0.11 needs 3.12 or newer; a C extension built for
# another version is skipped and its fallback loads):
#   .venv/bin/pip download --no-deps --python-version 3.12 --only-binary=:all: -d wheels flax \
#     optax qwix treescope etils absl-py rich pygments markdown-it-py mdurl typing_extensions \
#     filelock opt_einsum pyyaml msgpack
# (4.8 MB; checked on 2026-12-04 in a fresh venv holding only jax, jaxlib and numpy.)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
wheels="${ESSA_WHEELS:-$root/wheels}"
python="${PYTHON:-python3}"
path="$root"
if [ -d "$wheels" ]; then
  site="$(mktemp -d "${TMPDIR:-/tmp}/essa_wheels.XXXXXX")"
  for w in "$wheels"/*.whl; do
    if [ -e "$w" ]; then
      "$python" -m zipfile -e "$w" "$site"
    fi
  done
  path="$path:$site"
fi
export PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}"
export MSGPACK_PUREPYTHON="${MSGPACK_PUREPYTHON:-1}"
cd "$root"
exec "$python" -m benchmarks.device_check "$@"
