"""ESSA on the generated instruction-following task (IFEval format), SmolLM2-135M-Instruct.

The task (`essa_jax.data.instructions`, docs/IFEVAL.md): "Describe bees. Answer with less than 31
words." and the like, one or two IFEval instructions per prompt over 12 instruction types. The
fitness is IFEval's instruction-level strict score (the fraction of a prompt's instructions the
completion follows, lm-eval's checkers: `essa_jax.rewards.ifeval`); the held-out accuracy counts a
prompt correct when all its instructions are followed (prompt-level strict).

Settings follow essa_smollm2_arith.py (the tuned CPU setting of this model: CMA-ES with mirrored
pairs, sigma_0 = 2 relative to each SFT singular value, the top singular value of each factor),
with the lengths of this task: prompts of 64-96 tokens (SmolLM2's default system turn), reference
responses of up to 53 tokens, and 8 prompts per candidate (a generation is 16 x 8 rows of up to 64
new tokens: a 135M model writes ~1.5 rows/s on the 2-core CPU, experiments/results/
instructions_probe.json). The SFT target is each prompt's reference response, built with the
prompt so that it follows every instruction (2 steps: a short warm start, as for arithmetic).
"""

from essa_jax.config import base_config


def get_config():
    c = base_config()
    c.method = "essa"
    c.seed = 0
    c.max_wall_seconds = 1800.0  # loop wall-clock; experiments/compare_instructions.sh sets it
    c.model.path = "smollm2-135m-instruct"
    c.task.name = "instructions"  # one or two instructions per prompt
    c.task.prompt_format = "chat"
    # The chat template's own system turn, as lm-eval's --apply_chat_template renders a prompt, so
    # the run's held-out prompts and experiments/compare_instructions.py's lm-eval ones agree.
    c.task.system_prompt = "default"
    c.task.reward = "ifeval_inst_strict"
    c.task.num_train = 2000
    c.task.num_heldout = 200
    c.task.max_prompt_tokens = 112  # the longest prompt is 96 tokens
    c.lora.rank = 4
    c.lora.alpha = 8.0
    c.lora.targets = ("q", "k", "v", "o")
    c.sft.steps = 2
    c.sft.batch_size = 16
    c.sft.learning_rate = 1e-3
    c.essa.strategy = "cma_es"
    c.essa.mirrored = True
    c.essa.population_size = 16
    c.essa.prompts_per_candidate = 8
    c.essa.generations = 30
    c.essa.sigma_init = 2.0
    c.essa.alpha = 0.25
    c.essa.greedy = True
    # Reference responses are at most 53 tokens; a longer completion has broken a length or
    # ending instruction already.
    c.generation.max_new_tokens = 64
    c.eval.every = 10
    c.eval.batch_size = 100
    c.eval.base_model = True
    c.checkpoint.every = 10
    return c
