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

from essa_jax.config import UNSET, base_config


def get_config():
    c = base_config()
    c.method = "essa"
    c.model.path = UNSET  # /path/to/Llama-3.1-8B(-Instruct): HF dir with config.json + safetensors
    c.model.name = "Llama-3.1-8B"  # its shape, for the plan (essa_jax.plan)
    c.model.dtype = "bfloat16"
    c.task.name = "ifeval"
    c.task.path = UNSET  # IFEval-format training rows with a `response` column
    c.task.eval_path = UNSET  # IFEval-format held-out rows (e.g. IFEval's 541 prompts)
    c.task.prompt_format = "chat"
    c.task.system_prompt = "default"  # the chat template's own
    c.task.reward = "ifeval_inst_strict"
    c.task.num_train = 10000
    c.task.num_heldout = 541
    c.task.max_prompt_tokens = 256
    c.lora.rank = 8  # paper default
    c.lora.alpha = 16.0
    c.lora.targets = ("q", "k", "v", "o")
    c.sft.steps = 300
    c.sft.batch_size = 16
    c.sft.learning_rate = 2e-4
    c.sft.micro_batch_size = 2  # rows per device at a time (16 / 8 devices)
    c.essa.strategy = "cma_es"
    c.essa.population_size = 96  # paper default (24 .. 96)
    c.essa.prompts_per_candidate = 100  # "batch" 100 (100 .. 300)
    c.essa.generations = 200
    c.essa.sigma_init = 0.1
    c.essa.alpha = 1.0
    c.essa.greedy = True
    c.essa.prompt_sampling = "per_candidate"
    # Rows per device at a time: 12 members x 100 prompts = 1200 rows per device; the chunk is
    # the plan's (docs/IFEVAL.md).
    c.essa.rows_per_chunk = 300
    c.generation.max_new_tokens = 512
    c.eval.every = 10
    c.eval.batch_size = 128
    c.checkpoint.every = 10
    return c
