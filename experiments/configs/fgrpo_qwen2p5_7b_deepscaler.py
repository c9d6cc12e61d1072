"""F-GRPO, paper setting: Qwen2.5-7B on DeepScaleR (arXiv 2602.06717, Sec. 5).

    python -m essa_jax.main --config experiments/configs/fgrpo_qwen2p5_7b_deepscaler.py \
        --workdir runs/fgrpo_deepscaler --config.model.path=/ckpt/Qwen2.5-7B \
        --config.task.path=/data/deepscaler/train.jsonl

Paper: beta = 0, clip 0.2 / 0.2 (DAPO 0.2 / 0.28: --config.grpo.eps_high=0.28; CISPO:
--config.grpo.loss=cispo --config.grpo.eps_low=1.0 --config.grpo.eps_high=5.0), token-mean,
AdamW lr 1e-6, wd 0.01, grad clip 1.0, N = 8, temperature 1.0, gamma in {0.5, 1, 2} (0.5 best).
Reported (math average pass@1 / pass@256): GRPO 37.3 / 64.1 -> F-GRPO 38.6 / 70.3.
As in the paper, every weight is trained (train.params = "full": float32 masters and AdamW state
over the bf16 weights, sharded over the data axis, essa_jax.lora.full) and GRPO starts from the
model itself (sft.steps = 0); no SFT stage runs. The run exports the trained model as a Hugging
Face checkpoint (workdir/model). --config.train.params=lora gives the rank-64 LoRA stand-in of
before (every projection, PEFT's plain scale alpha / r = 2).
"""

from essa_jax.config import UNSET, base_config
from essa_jax.data import PAPER_SYSTEM_PROMPT


def get_config():
    c = base_config()
    c.method = "fgrpo"
    c.model.path = UNSET  # /path/to/Qwen2.5-7B
    c.model.name = "Qwen2.5-7B"  # its shape, for the plan (essa_jax.plan)
    c.model.dtype = "bfloat16"
    c.task.name = "deepscaler"
    c.task.path = UNSET  # /path/to/DeepScaleR-Preview-Dataset (problem, answer, solution)
    c.task.prompt_format = "chat"
    c.task.system_prompt = PAPER_SYSTEM_PROMPT
    c.task.num_train = 40000
    c.task.num_heldout = 500
    c.task.max_prompt_tokens = 512
    c.train.params = "full"  # the paper fine-tunes every weight (verl, AdamW lr 1e-6)
    c.lora.rank = 64  # used only with --config.train.params=lora
    c.lora.alpha = 128.0
    c.lora.targets = ("q", "k", "v", "o", "gate", "up", "down")
    c.sft.steps = 0  # the paper has no SFT stage: GRPO from the model itself
    c.grpo.steps = 500
    c.grpo.batch_size = 512  # 64 prompts x N = 8
    c.grpo.group_size = 8
    c.grpo.learning_rate = 1e-6
    c.grpo.weight_decay = 0.01
    c.grpo.max_grad_norm = 1.0
    c.grpo.loss = "grpo"
    c.grpo.eps_low = 0.2
    c.grpo.eps_high = 0.2
    c.grpo.agg = "token_mean"
    c.grpo.adv_scale = "group"
    c.grpo.focal_gamma = 0.5
    c.grpo.beta = 0.0
    c.grpo.temperature = 1.0
    c.generation.max_new_tokens = 4096
    c.eval.every = 25
    c.eval.pass_k_samples = 256
    c.eval.pass_k = (1, 8, 64, 256)
    c.eval.pass_k_problems = 100
    c.eval.batch_size = 64  # 64 rows x (512 + 4096) tokens of KV cache: ~17 GB
    # Memory: data-parallel over 8 devices, each generates its 64 of the 512 rollouts of 4608
    # tokens (one chunk) and accumulates its update over micro-batches of 4 rows with per-layer
    # activation checkpointing. Full-parameter: each device holds 1/8 of the masters, AdamW state
    # and base (7.6e9 x 14 B / 8 = 13 GB) and, during a program, the gathered bf16 weights
    # (15 GB) and one micro-batch's bf16 gradient (15 GB). plan.json's rows for this config are
    # the LoRA stand-in's until `make plan` is rerun (not rerun for the full-parameter change).
    c.model.remat = True
    c.grpo.rows_per_chunk = 64
    c.grpo.micro_batch_size = 4  # rows per device at a time (512 / 8 devices = 64 rows each)
    c.checkpoint.every = 25
    return c
