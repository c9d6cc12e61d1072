"""Benchmarks (`make bench`); see benchmarks/run.py."""

from essa_jax import distributed as _distributed

# libtpu (installed with the test extras for the plan's TPU targets) would otherwise probe for TPU
# hardware in every section's process and print its warnings into the tables.
_distributed.skip_absent_tpu()
