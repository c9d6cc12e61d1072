"""A tiny ESSA run (random 2-layer model, generated arithmetic) whose search moves every generation.

Used by the fault, resume and multi-process tests, which assert that the CMA-ES state moved before
they assert that it resumed (or matched) exactly: a state that never leaves its start would pass
any "equal" check. A random model never solves add_2d (fitness 0 for every candidate: CMA-ES would
skip every `tell`, `essa.skip_flat`), so the fitness is the library's dense `char_match` reward
(closeness of each character to the answer's), the SFT step is large enough to give the singular
values some spread, and sigma_init = 1 perturbs each of them by its own size, so that candidates'
greedy completions differ and every generation updates mean, sigma, paths and covariance.
"""

from essa_jax.config import base_config


def get_config():
    c = base_config()
    c.method = "essa"
    c.seed = 0
    c.model.path = "random:tiny"
    c.task.name = "add_2d"
    c.task.reward = "char_match"
    c.task.num_train = 64
    c.task.num_heldout = 8
    c.task.max_prompt_tokens = 48
    c.lora.rank = 2
    c.lora.alpha = 4.0
    c.sft.steps = 4  # fewer: the greedy completions are mostly empty, the fitness flat
    c.sft.batch_size = 4
    c.sft.learning_rate = 3e-2
    c.essa.population_size = 8
    c.essa.prompts_per_candidate = 4
    c.essa.generations = 6
    c.essa.sigma_init = 1.0
    c.generation.max_new_tokens = 3
    c.eval.every = 0
    c.eval.batch_size = 8
    c.eval.pass_k_samples = 0
    c.checkpoint.every = 1
    c.checkpoint.keep = 3
    return c
