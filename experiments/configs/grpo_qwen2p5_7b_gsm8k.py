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

import os

from essa_jax.config import load_config_file


def _sibling(name: str):
    return load_config_file(os.path.join(os.path.dirname(__file__), name))


def get_config():
    # F-GRPO's verl settings, every weight trained (train.params = "full"), gamma 0 = GRPO ...
    c = _sibling("fgrpo_qwen2p5_7b_deepscaler.py")
    c.method = "grpo"
    c.grpo.focal_gamma = 0.0
    c.grpo.steps = 200
    # ... on the ESSA paper's model, task and lengths (essa_qwen2p5_7b_gsm8k.py).
    essa = _sibling("essa_qwen2p5_7b_gsm8k.py")
    c.model.path, c.model.name = essa.model.path, essa.model.name
    c.task = essa.task
    c.generation.max_new_tokens = essa.generation.max_new_tokens
    c.eval.every, c.eval.batch_size = essa.eval.every, essa.eval.batch_size
    c.eval.pass_k_samples = 0  # accuracy, as the ESSA paper reports
    c.checkpoint.every = essa.checkpoint.every
    # Memory (8 x 80 GB; `make plan`, 2026-12-05: the update 68.4 GB, the rollout 40.3 GB per
    # device): each device generates its 64 rollouts in one chunk and accumulates the update
    # over micro-batches of 4 rows with remat (the deepscaler config's settings); 1/8 of the
    # masters and AdamW state per device (11.4 GB), the gathered bf16 weights (15 GB) and one
    # micro-batch's bf16 gradient during the update.
    return c
