"""A tiny full-parameter GRPO run (random 2-layer model, every weight trained, `train.params =
"full"`) whose weights move every step: the dense `char_match` reward gives every group reward
spread, so the advantages and the gradient are never all zero. For the SIGKILL / resume test."""

from essa_jax.config import base_config


def get_config():
    c = base_config()
    c.method = "grpo"
    c.train.params = "full"
    c.seed = 0
    c.model.path = "random:tiny"
    c.task.name = "add_2d"
    c.task.reward = "char_match"
    c.task.num_train = 64
    c.task.num_heldout = 8
    c.task.max_prompt_tokens = 48
    c.sft.steps = 2
    c.sft.batch_size = 4
    c.grpo.steps = 5
    c.grpo.batch_size = 8
    c.grpo.group_size = 4
    c.grpo.learning_rate = 1e-3
    c.generation.max_new_tokens = 3
    c.eval.every = 0
    c.eval.batch_size = 8
    c.eval.pass_k_samples = 0
    c.checkpoint.every = 1
    c.checkpoint.keep = 10
    return c
