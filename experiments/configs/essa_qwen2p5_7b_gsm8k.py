"""ESSA, paper setting: Qwen2.5-Math-7B on GSM8K (arXiv 2507.04453, Sec. 4; Fig. 2).

For GPU / TPU users: set the local checkpoint and data (nothing is downloaded at run time):

    python -m essa_jax.main --config experiments/configs/essa_qwen2p5_7b_gsm8k.py \
        --workdir runs/essa_gsm8k --config.model.path=/ckpt/Qwen2.5-Math-7B \
        --config.task.path=/data/gsm8k/train.jsonl

Reported: 0.85-0.90 test accuracy in 10-20 min on 8 GPUs (GRPO: 60-100 min).
Reported variants: rank 2..32 (rank 2: genome 28 layers x 4 x 2 x 2 = 448 values); population
24..96 (8 is too small; gains flatten from 24 to 96); alpha 0.1..1.0 (>= 0.4 stable); prompts per
candidate 100..300; INT8 / INT4 inference barely changes accuracy.
"""

from essa_jax.config import UNSET, base_config
from essa_jax.data import PAPER_SYSTEM_PROMPT


def get_config():
    c = base_config()
    c.method = "essa"
    c.model.path = UNSET  # /path/to/Qwen2.5-Math-7B (HF dir with config.json + safetensors)
    c.model.name = "Qwen2.5-Math-7B"  # its shape, for the plan (essa_jax.plan)
    c.model.dtype = "bfloat16"
    c.task.name = "gsm8k"
    c.task.path = UNSET  # /path/to/gsm8k train file (jsonl / parquet / save_to_disk folder)
    c.task.prompt_format = "chat"
    c.task.system_prompt = PAPER_SYSTEM_PROMPT  # "Please reason step by step ... \boxed{}."
    c.task.num_train = 7473
    c.task.num_heldout = 500
    c.task.max_prompt_tokens = 384
    c.lora.rank = 8  # paper default; 2..32 reported
    c.lora.alpha = 16.0
    c.lora.targets = ("q", "k", "v", "o")
    c.sft.steps = 460  # ~1 epoch of 7.4k at batch 16
    c.sft.batch_size = 16
    c.sft.learning_rate = 2e-4  # paper: 1e-4 .. 5e-4 for 7B
    c.sft.micro_batch_size = 2  # rows per device at a time (16 / 8 devices): no remat needed
    c.essa.strategy = "cma_es"
    c.essa.population_size = 96  # paper default (24 .. 96)
    c.essa.prompts_per_candidate = 100  # "batch" 100 (100 .. 300)
    c.essa.generations = 200
    c.essa.sigma_init = 0.1
    c.essa.alpha = 1.0  # fraction of singular values evolved (0.4 .. 1.0 stable)
    c.essa.greedy = True
    # Each candidate scores on its own mini-batch of prompts, as the ESSA paper does
    # (arXiv 2507.04453). The population is split over all devices (config.mesh defaults).
    c.essa.prompt_sampling = "per_candidate"
    # Memory (python -m essa_jax.plan, 8 x 80 GB; experiments/results/plan.json): each device
    # generates its 12 members x 100 prompts = 1200 rows in 4 chunks of 300 (the chunk the
    # estimate picks for 80 GB; 0 would pick it from the device's memory at run time).
    c.essa.rows_per_chunk = 300
    c.generation.max_new_tokens = 512
    c.eval.every = 10
    c.eval.batch_size = 250
    c.checkpoint.every = 10
    return c
