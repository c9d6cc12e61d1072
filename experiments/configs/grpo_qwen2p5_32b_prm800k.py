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

import os

from essa_jax.config import load_config_file


def _sibling(name: str):
    return load_config_file(os.path.join(os.path.dirname(__file__), name))


def get_config():
    c = _sibling("grpo_qwen2p5_7b_gsm8k.py")  # the GRPO settings, every weight trained
    essa = _sibling("essa_qwen2p5_32b_prm800k.py")  # the model, task and lengths
    c.model.path, c.model.name = essa.model.path, essa.model.name
    c.task = essa.task
    c.generation.max_new_tokens = essa.generation.max_new_tokens
    c.grpo.steps = 300
    c.mesh.model = essa.mesh.model  # 4: tensor parallel, ZeRO over the data axis
    c.grpo.rows_per_chunk = 32
    c.grpo.micro_batch_size = 2
    return c
