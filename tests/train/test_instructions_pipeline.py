"""ESSA and GRPO end to end on the generated instruction task, IFEval reward, tiny model."""

import json

import pytest

pytest.importorskip("lm_eval")

from test_pipelines import tiny_config  # noqa: E402

from essa_jax.train import train_and_evaluate  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("method", ["essa", "grpo"])
def test_instruction_task_trains_on_the_ifeval_reward(method, tmp_path):
    c = tiny_config(method, 2)
    c.task.name = "instructions_l1"
    c.task.prompt_format = "chat"
    c.task.reward = "ifeval_inst_strict"
    c.task.max_prompt_tokens = 512  # the char tokenizer: one token per character
    c.generation.max_new_tokens = 8
    s = train_and_evaluate(c, str(tmp_path), verbose=False)
    assert s["steps"] == 2 and 0.0 <= s["final_heldout_acc"] <= 1.0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward"] for r in rows if "reward" in r]
    # Random text follows some instructions (no commas, no forbidden word): the reward is not 0.
    assert rewards and max(rewards) > 0.0
