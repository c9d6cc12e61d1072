"""GRPO on the same task as essa_smollm2_arith.py (same SFT warm start), for direct comparison.

LoRA factors trained by GRPO (arXiv 2402.03300): group N = 8, clip 0.2, token-mean loss, no KL.
The learning rate is far above the F-GRPO paper's 1e-6 (that is for full 7B fine-tuning); rank-4
LoRA on a 135M model needs ~1e-4 to move within a CPU budget.
"""

from essa_jax.config import base_config


def get_config():
    c = base_config()
    c.method = "grpo"
    c.model.path = "smollm2-135m-instruct"
    c.task.name = "add_2d"
    c.task.prompt_format = "prefill"
    c.task.system_prompt = ""  # an empty system turn: 32-token prompts instead of 48
    c.task.num_train = 2000
    c.task.num_heldout = 200
    c.lora.rank = 4
    c.lora.alpha = 8.0
    c.lora.targets = ("q", "k", "v", "o")
    c.sft.steps = 4  # the same SFT warm start as essa_smollm2_arith.py
    c.sft.batch_size = 16
    c.sft.learning_rate = 1e-3
    c.grpo.steps = 60
    c.grpo.batch_size = 32  # 4 prompts x N = 8 rollouts per step
    c.grpo.group_size = 8
    c.grpo.learning_rate = 1e-4
    c.grpo.weight_decay = 0.01
    c.grpo.max_grad_norm = 1.0
    c.grpo.loss = "grpo"
    c.grpo.eps_low = 0.2
    c.grpo.eps_high = 0.2
    c.grpo.agg = "token_mean"
    c.grpo.adv_scale = "group"
    c.grpo.focal_gamma = 0.0
    c.grpo.beta = 0.0
    c.grpo.temperature = 1.0
    c.generation.max_new_tokens = 5
    c.eval.every = 10
    c.eval.pass_k_samples = 16
    c.eval.pass_k = (1, 4, 16)
    c.eval.pass_k_problems = 50
    c.checkpoint.every = 10
    return c
