"""GRPO, the ESSA paper's baseline: Qwen2.5-32B on PRM800K, every weight trained (arXiv
2507.04453, Sec. 4, Fig. 3: time to 0.835 accuracy, GRPO 400 min on 16 GPUs -> 150 min on 128;
ESSA about 2x faster at 16 and 6x at 128).

    python -m essa_jax.main --config experiments/configs/grpo_qwen2p5_32b_prm800k.py \
        --workdir runs/grpo_prm800k --config.model.path=/ckpt/Qwen2.5-32B \
        --config.task.path=/data/prm800k/train.jsonl

Hyper-parameters as grpo_qwen2p5_7b_gsm8k.py (the ESSA paper does not list its GRPO's; F-GRPO's
verl settings), lengths as essa_qwen2p5_32b_prm800k.py. 32.8e9 weights x 14 bytes (bf16 base,
float32 masters, AdamW m and v) = 459 GB: tensor parallel over mesh.model = 4 and sharded over the
data axis (ZeRO / FSDP, essa_jax.lora.full), 16 devices hold 29 GB each of it; the gathered bf16
weights of a program are 65.5 / 4 = 16 GB per device. Which of 16 / 32 / 64 x 80 GB is the
smallest that fits has not been planned yet (`make plan`).
"""

from essa_jax.config import UNSET, base_config
from essa_jax.data import PAPER_SYSTEM_PROMPT


def get_config():
    c = base_config()
    c.method = "grpo"
    c.train.params = "full"
    c.model.path = UNSET  # /path/to/Qwen2.5-32B
    c.model.name = "Qwen2.5-32B"  # its shape, for the plan (essa_jax.plan)
    c.model.dtype = "bfloat16"
    c.task.name = "prm800k"
    c.task.path = UNSET  # /path/to/prm800k problems (MATH-style: problem, answer / solution)
    c.task.prompt_format = "chat"
    c.task.system_prompt = PAPER_SYSTEM_PROMPT
    c.task.num_train = 12000
    c.task.num_heldout = 500
    c.task.max_prompt_tokens = 512
    c.sft.steps = 0
    c.grpo.steps = 300
    c.grpo.batch_size = 512  # 64 prompts x N = 8
    c.grpo.group_size = 8
    c.grpo.learning_rate = 1e-6
    c.grpo.weight_decay = 0.01
    c.grpo.max_grad_norm = 1.0
    c.grpo.loss = "grpo"
    c.grpo.eps_low = 0.2
    c.grpo.eps_high = 0.2
    c.grpo.agg = "token_mean"
    c.grpo.beta = 0.0
    c.grpo.temperature = 1.0
    c.generation.max_new_tokens = 1024
    c.mesh.model = 4
    c.model.remat = True
    c.grpo.rows_per_chunk = 32
    c.grpo.micro_batch_size = 2
    c.eval.every = 10
    c.eval.batch_size = 250
    c.checkpoint.every = 10
    return c
