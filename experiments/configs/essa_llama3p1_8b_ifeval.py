"""ESSA, paper setting: Llama-3.1-8B on IFEval (arXiv 2507.04453 v3: +22.5 points over GRPO).

For GPU / TPU users: set the local checkpoint and data (nothing is downloaded at run time):

    python -m essa_jax.main --config experiments/configs/essa_llama3p1_8b_ifeval.py \
        --workdir runs/essa_ifeval --config.model.path=/ckpt/Llama-3.1-8B-Instruct \
        --config.task.path=/data/ifeval_train.jsonl --config.task.eval_path=/data/ifeval.jsonl

Data: IFEval-format rows (`key`, `prompt`, `instruction_id_list`, `kwargs`; docs/IFEVAL.md). The
training file needs a `response` column (a reference response, the SFT target) for ESSA's SFT
warm start; the held-out file can be IFEval itself (541 prompts). The fitness is IFEval's
instruction-level strict score (lm-eval's checkers, `essa_jax.rewards.ifeval`); the final numbers
to report come from lm-eval on the finished run (`python -m essa_jax.evaluate_lm --run ...
--tasks ifeval`).

Shapes: Llama-3.1-8B (shared/docs/SCALE.md; `models/shapes.py`: 32 layers, d 4096, 8 KV heads,
vocab 128256, llama3 rope). The paper's IFEval hyper-parameters beyond the model are not given in
PAPERS.md; these are the paper's defaults (rank 8, population 96, 100 prompts per candidate,
bf16). IFEval responses are long (lm-eval lets a model write 1280 tokens): 512 new tokens here,
prompts up to 256 tokens (IFEval's longest prompts are ~200 Llama-3 tokens). Memory:
`python -m essa_jax.plan --config experiments/configs/essa_llama3p1_8b_ifeval.py --devices 8
--device_memory_gb 80` (docs/IFEVAL.md records the result).
"""

import os

from essa_jax.config import UNSET, load_config_file


def get_config():
    # The paper's defaults as essa_qwen2p5_7b_gsm8k.py sets them (LoRA r8 on q/k/v/o, SFT batch 16
    # at 2e-4 in micro-batches of 2, CMA-ES population 96 x 100 prompts per candidate, sigma 0.1,
    # alpha 1.0, greedy, rows in chunks of 300, 512 new tokens, bf16); the model and task here.
    here = os.path.dirname(__file__)
    c = load_config_file(os.path.join(here, "essa_qwen2p5_7b_gsm8k.py"))
    c.model.path = UNSET  # /path/to/Llama-3.1-8B(-Instruct): HF dir with config.json + safetensors
    c.model.name = "Llama-3.1-8B"  # its shape, for the plan (essa_jax.plan)
    c.task.name = "ifeval"
    c.task.path = UNSET  # IFEval-format training rows with a `response` column
    c.task.eval_path = UNSET  # IFEval-format held-out rows (e.g. IFEval's 541 prompts)
    c.task.system_prompt = "default"  # the chat template's own
    c.task.reward = "ifeval_inst_strict"
    c.task.num_train = 10000
    c.task.num_heldout = 541
    c.task.max_prompt_tokens = 256
    c.sft.steps = 300
    c.eval.batch_size = 128
    return c
