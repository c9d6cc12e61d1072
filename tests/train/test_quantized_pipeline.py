"""`model.quantize` end to end on the tiny random model: SFT on the float weights, then ESSA's
population / GRPO (QLoRA-style) / held-out evaluation on the int8 or int4 base."""

import jax
import pytest

from essa_jax.config import base_config
from essa_jax.models import QuantizedKernel
from essa_jax.train import pipeline

pytestmark = pytest.mark.slow


def tiny_config(method: str, mode: str):
    c = base_config()
    c.method = method
    c.model.path = "random:tiny"
    c.model.quantize = mode
    c.task.num_train = 32
    c.task.num_heldout = 4
    c.sft.steps = 1
    c.sft.batch_size = 4
    c.essa.population_size = 4
    c.essa.prompts_per_candidate = 2
    c.essa.generations = 1
    c.essa.greedy = False
    c.grpo.steps = 1
    c.grpo.batch_size = 4
    c.grpo.group_size = 2
    c.generation.max_new_tokens = 2
    c.eval.every = 0
    c.eval.batch_size = 4
    c.checkpoint.every = 0
    return c


@pytest.mark.parametrize("method,mode", [("essa", "int4"), ("grpo", "int8")])
def test_quantized_run(method, mode, tmp_path, monkeypatch):
    seen = {}
    build = pipeline.build_run

    def spy(config, workdir, **kw):
        run = build(config, workdir, **kw)
        seen["run"] = run
        return run

    monkeypatch.setattr(pipeline, "build_run", spy)
    sft = pipeline.train_sft

    def sft_spy(lora, params, *a, **kw):
        seen["sft_kernel"] = params["layers"]["q"]["kernel"]
        return sft(lora, params, *a, **kw)

    monkeypatch.setattr(pipeline, "train_sft", sft_spy)
    s = pipeline.train_and_evaluate(tiny_config(method, mode), str(tmp_path), verbose=False)
    assert s["steps"] == 1 and 0.0 <= s["final_heldout_acc"] <= 1.0
    run = seen["run"]
    kernel = run.infer_params["layers"]["q"]["kernel"]
    assert isinstance(kernel, QuantizedKernel)
    assert kernel.qarray.qvalue.dtype.name == mode
    # SFT trained on the float weights, which the run dropped after it (only the quantised base
    # stays resident).
    assert isinstance(seen["sft_kernel"], jax.Array)
    assert run.params is None
