"""GRPO, the ESSA paper's baseline: Qwen2.5-Math-7B on GSM8K, every weight trained (arXiv
2507.04453, Sec. 4, Fig. 2: ESSA reaches 0.85-0.90 in 10-20 min on 8 GPUs, this GRPO in 60-100).

    python -m essa_jax.main --config experiments/configs/grpo_qwen2p5_7b_gsm8k.py \
        --workdir runs/grpo_gsm8k --config.model.path=/ckpt/Qwen2.5-Math-7B \
        --config.task.path=/data/gsm8k/train.jsonl

The ESSA paper compares with GRPO that fine-tunes the whole model ("about a million times fewer
parameters": 7.6e9 weights against ESSA's 448 singular values) but does not list its GRPO
hyper-parameters; these are F-GRPO's verl settings (arXiv 2602.06717, Sec. 5: AdamW lr 1e-6, wd
0.01, clip 1.0, N = 8, beta = 0, token mean), with this task's prompt and answer lengths as in
essa_qwen2p5_7b_gsm8k.py. GRPO starts from the model itself (sft.steps = 0). The run exports the
trained model as a Hugging Face checkpoint (workdir/model).
"""

from essa_jax.config import UNSET, base_config
from essa_jax.data import PAPER_SYSTEM_PROMPT


def get_config():
    c = base_config()
    c.method = "grpo"
    c.train.params = "full"  # every weight: float32 masters + AdamW state, sharded over data
    c.model.path = UNSET  # /path/to/Qwen2.5-Math-7B
    c.model.name = "Qwen2.5-Math-7B"  # its shape, for the plan (essa_jax.plan)
    c.model.dtype = "bfloat16"
    c.task.name = "gsm8k"
    c.task.path = UNSET  # /path/to/gsm8k train file
    c.task.prompt_format = "chat"
    c.task.system_prompt = PAPER_SYSTEM_PROMPT
    c.task.num_train = 7473
    c.task.num_heldout = 500
    c.task.max_prompt_tokens = 384
    c.sft.steps = 0
    c.grpo.steps = 200
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
    c.generation.max_new_tokens = 512
    # Memory (8 x 80 GB, not yet planned by `make plan`): each device generates its 64 rollouts
    # in one chunk and accumulates the update over micro-batches of 4 rows with remat; 1/8 of the
    # masters, AdamW state and base per device (13 GB), the gathered bf16 weights (15 GB) and one
    # micro-batch's bf16 gradient (15 GB) during the update.
    c.model.remat = True
    c.grpo.rows_per_chunk = 64
    c.grpo.micro_batch_size = 4
    c.eval.every = 10
    c.eval.batch_size = 250
    c.checkpoint.every = 10
    return c
