"""ESSA on the generated instruction-following task (IFEval format), SmolLM2-135M-Instruct.

The task (`essa_jax.data.instructions`, docs/IFEVAL.md): "Describe bees. Answer with less than 31
words." and the like, one or two IFEval instructions per prompt over 12 instruction types. The
fitness is IFEval's instruction-level strict score (the fraction of a prompt's instructions the
completion follows, lm-eval's checkers: `essa_jax.rewards.ifeval`); the held-out accuracy counts a
prompt correct when all its instructions are followed (prompt-level strict).

Everything else is essa_smollm2_arith.py (the tuned CPU setting of this model: LoRA r4 on q/k/v/o,
2 SFT steps, CMA-ES with 8 mirrored pairs, sigma_0 = 2 relative to each SFT singular value, the
top singular value of each factor, greedy rollouts), with the lengths of this task: prompts of
64-96 tokens (SmolLM2's default system turn), reference responses of up to 53 tokens, and 8
prompts per candidate (a generation is 16 x 8 rows of up to 64 new tokens; the probe decoded 64
tokens at ~0.5 rows/s on the shared 2-core CPU, experiments/results/instructions_probe.json). The
SFT target is each prompt's reference response, built with the prompt so that it follows every
instruction.
"""

import os

from essa_jax.config import load_config_file


def get_config():
    c = load_config_file(os.path.join(os.path.dirname(__file__), "essa_smollm2_arith.py"))
    c.max_wall_seconds = 1800.0  # loop wall-clock; experiments/compare_instructions.sh sets it
    c.task.name = "instructions"  # one or two instructions per prompt
    c.task.prompt_format = "chat"
    # The chat template's own system turn, as lm-eval's --apply_chat_template renders a prompt, so
    # the run's held-out prompts and experiments/compare_instructions.py's lm-eval ones agree.
    c.task.system_prompt = "default"
    c.task.reward = "ifeval_inst_strict"
    c.task.max_prompt_tokens = 112  # the longest prompt is 96 tokens
    c.essa.prompts_per_candidate = 8
    # Reference responses are at most 53 tokens; a longer completion has broken a length or
    # ending instruction already.
    c.generation.max_new_tokens = 64
    return c
