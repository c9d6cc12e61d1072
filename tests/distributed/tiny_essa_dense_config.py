"""The tiny ESSA run of tiny_essa_config.py with a dense reward, so fitness differs across members.

A random 2-layer model never solves add_2d (fitness all 0: CMA-ES would never move), so this config
registers `char_code`, a deterministic score of the completion's characters, and perturbs the
singular values strongly (sigma_init 1.0 after a larger SFT step) so members' greedy completions
differ. Used by test_main_multiprocess.py to compare a 2-process run with a 1-process run.
"""

import os

from essa_jax.config import load_config_file
from essa_jax.rewards import REWARDS, register_reward


def char_code_reward(prompts, completions, **_):
    """Mean of (code point mod 10) / 9 over the completion's characters (0 for an empty one)."""
    return [sum(ord(ch) % 10 for ch in c) / (9.0 * len(c)) if c else 0.0 for c in completions]


if "char_code" not in REWARDS:
    register_reward("char_code", char_code_reward)


def get_config():
    c = load_config_file(os.path.join(os.path.dirname(__file__), "tiny_essa_config.py"))
    c.task.reward = "char_code"
    c.sft.steps = 4
    c.sft.learning_rate = 3e-2
    c.essa.sigma_init = 1.0
    c.essa.generations = 3
    c.checkpoint.every = 0
    return c
