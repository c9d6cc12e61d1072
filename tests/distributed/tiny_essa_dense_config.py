"""tiny_essa_config.py (dense `char_match` fitness, a search that moves) with 3 generations and no
checkpoints unless asked: the multi-process and checkpoint-fallback tests' run
(test_main_multiprocess.py, test_resume_fallback_main.py)."""

import os

from essa_jax.config import load_config_file


def get_config():
    c = load_config_file(os.path.join(os.path.dirname(__file__), "tiny_essa_config.py"))
    c.essa.generations = 3
    c.checkpoint.every = 0
    return c
