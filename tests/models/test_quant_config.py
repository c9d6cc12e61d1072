"""model.quantize / model.quant_group: validated before any weight is read, naming the field."""

import pytest

from essa_jax.config import ConfigError, base_config
from essa_jax.train import validate_config


def config(**model):
    c = base_config()
    c.model.path = "random:tiny"  # projections' inputs 32 and 64
    for k, v in model.items():
        setattr(c.model, k, v)
    return c


@pytest.mark.parametrize("mode", ["none", "int8", "int4"])
def test_valid_modes(mode):
    validate_config(config(quantize=mode), num_devices=1)


def test_bad_values_name_the_field_and_valid_ones():
    with pytest.raises(ConfigError, match=r"model.quantize = 'int3'.*'none' \| 'int8' \| 'int4'"):
        validate_config(config(quantize="int3"), num_devices=1)
    with pytest.raises(ConfigError, match=r"model.quant_group = 0 .*integers >= 1"):
        validate_config(config(quantize="int4", quant_group=0), num_devices=1)
    with pytest.raises(ConfigError, match=r"model.quant_group = 48 .*\[1, 2, 4, 8, 16, 32\]"):
        validate_config(config(quantize="int4", quant_group=48), num_devices=1)
    # int8 has one scale per output channel: the group is not used, so not checked.
    validate_config(config(quantize="int8", quant_group=48), num_devices=1)


def test_smollm2_group_checked_from_the_gguf_header(smollm2_gguf_path):
    c = config(quantize="int4", quant_group=128)
    c.model.path = "smollm2-135m-instruct"  # inputs 576 and 1536: 128 does not tile 576
    with pytest.raises(ConfigError, match=r"quant_group = 128 .*192\]"):
        validate_config(c, num_devices=1)
