"""tiny_essa_config.py's run (random 2-layer model, generated arithmetic, dense `char_match`
reward) as full-parameter GRPO (`train.params = "full"`): the reward gives every group spread, so
the advantages and the gradient are never all zero and the weights move every step. For the
SIGKILL / resume test."""

import os

from essa_jax.config import load_config_file


def get_config():
    c = load_config_file(os.path.join(os.path.dirname(__file__), "tiny_essa_config.py"))
    c.method = "grpo"
    c.train.params = "full"
    c.sft.steps = 2
    c.grpo.steps = 5
    c.grpo.batch_size = 8
    c.grpo.group_size = 4
    c.grpo.learning_rate = 1e-3
    c.checkpoint.keep = 10
    return c
