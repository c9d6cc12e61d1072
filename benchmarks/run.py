"""`make bench [SECTION=name]`: run one benchmark section or all of them.

Each section is a module `benchmarks/<section>.py` with a `main()` that prints a table and writes
`experiments/results/<result>.json`; a section in MODES is another section's module run with
arguments (population_memory: `benchmarks/population.py --memory`). Sections run in separate
processes so that peak-memory numbers and thread settings of one do not leak into the next, with
glibc's allocator set to keep freed memory (`essa_jax.hostmem`; the JSON's `machine.malloc` says
which).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from essa_jax import hostmem

SECTIONS = (
    "model",
    "decode_profile",
    "population",
    "population_memory",
    "strategies",
    "grpo",
    "rewards",
    "scaling",
    "plan",
    "quantization",
)

# Sections run as another section's module with arguments: name -> (module, arguments).
MODES = {"population_memory": ("population", ("--memory",))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--section", default="all", help=f"one of {SECTIONS} or 'all'")
    args = parser.parse_args()
    if args.section != "all" and args.section not in SECTIONS:
        parser.error(f"unknown section {args.section!r}; valid: {', '.join(SECTIONS)} or 'all'")
    chosen = SECTIONS if args.section == "all" else (args.section,)
    # Every section, both sides of a comparison alike, with glibc keeping freed memory
    # (essa_jax.hostmem); ESSA_JAX_MALLOC=system measures glibc's defaults instead.
    env = hostmem.retained_malloc_env(os.environ) or dict(os.environ)
    failed = []
    for name in chosen:
        print(f"\n######## benchmark section: {name} ########", flush=True)
        module, extra = MODES.get(name, (name, ()))
        rc = subprocess.call([sys.executable, "-m", f"benchmarks.{module}", *extra], env=env)
        if rc != 0:
            failed.append(name)
    if failed:
        sys.exit(f"benchmark sections failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
