"""A tiny ESSA run (random 2-layer model, generated arithmetic) for the fault tests."""

from essa_jax.config import base_config


def get_config():
    c = base_config()
    c.method = "essa"
    c.seed = 0
    c.model.path = "random:tiny"
    c.task.name = "add_2d"
    c.task.num_train = 64
    c.task.num_heldout = 8
    c.task.max_prompt_tokens = 48
    c.lora.rank = 2
    c.lora.alpha = 4.0
    c.sft.steps = 2
    c.sft.batch_size = 4
    c.essa.population_size = 8
    c.essa.prompts_per_candidate = 4
    c.essa.generations = 6
    c.generation.max_new_tokens = 3
    c.eval.every = 0
    c.eval.batch_size = 8
    c.eval.pass_k_samples = 0
    c.checkpoint.every = 1
    c.checkpoint.keep = 3
    return c
