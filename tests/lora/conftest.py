"""Fixtures for the LoRA tests (helpers live in lora_helpers.py)."""

import pytest
from lora_helpers import ALL_TARGETS, tiny_model

from essa_jax.lora import LoraConfig


@pytest.fixture(params=["llama", "qwen2"])
def model(request):
    return tiny_model(request.param)


@pytest.fixture
def lora_config():
    return LoraConfig(rank=4, alpha=8.0, targets=ALL_TARGETS)
