"""Experiment configuration: the schema every experiment config fills in, and its validation.

Every file in `experiments/configs/` starts from `base_config()` (all fields, with defaults and a
comment each), overrides what the experiment needs and returns the result from `get_config()`.
`essa_jax.main` locks the config (ml_collections refuses an unknown `--config.x=...` field)
and calls `validate_config` before any model is loaded or any function compiled: a wrong field
fails in a second with a message naming the field, the value given and the values that are valid.

Symbols follow the papers: ESSA (arXiv 2507.04453) for `lora` / `essa`, F-GRPO (arXiv 2602.06717)
for `grpo` (N = group_size, gamma = focal_gamma, eps_low / eps_high, beta).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from typing import Any

import ml_collections

METHODS = ("essa", "grpo", "fgrpo", "svdgrpo", "sft")
# The methods that may train the model's weights instead of an adapter (`train.params`).
FULL_PARAM_METHODS = ("sft", "grpo", "fgrpo")
DTYPES = ("auto", "float32", "bfloat16")
PROMPT_SAMPLINGS = ("shared", "per_candidate")
# Placeholder for configs that need a user's local checkpoint or dataset: fails validation.
UNSET = "<set me>"
RANDOM_PREFIX = "random:"


class ConfigError(ValueError):
    """A config field holds a value the pipeline cannot run with."""

    def __init__(self, field: str, value: Any, valid: str, hint: str = ""):
        self.field = field
        msg = f"config.{field} = {value!r} is invalid: valid values are {valid}"
        if hint:
            msg += f". {hint}"
        super().__init__(msg)


def base_config() -> ml_collections.ConfigDict:
    """Every field an experiment may set, with defaults (the small SmolLM2 CPU run)."""
    c = ml_collections.ConfigDict()
    # "essa": SFT LoRA -> SVD -> CMA-ES on singular values (ESSA, Alg. 1).
    # "grpo" / "fgrpo": SFT LoRA -> GRPO on the LoRA factors (fgrpo = focal weights, gamma > 0).
    # "svdgrpo": SFT LoRA -> SVD -> GRPO gradients on the same singular values ESSA evolves
    #            (ESSA's SVD-GRPO baseline, Sec. 5). "sft": SFT only, then evaluate.
    c.method = "essa"
    c.seed = 0
    # Seed of the training loop alone (ESSA's search and fitness prompts, GRPO's sampling and
    # prompt order); -1 = `seed`. Task data, the SFT adapter and evaluation stay on `seed`, so
    # runs that differ only here start from one SFT adapter (the seeds of an ablation cell).
    c.search_seed = -1
    # Wall-clock budget of the ES / RL phase in seconds (after SFT); 0 = none. Both loops stop at
    # the first step boundary past it, so equal budgets compare methods at equal cost.
    c.max_wall_seconds = 0.0

    c.model = ml_collections.ConfigDict()
    # HF checkpoint dir, .gguf file, "smollm2-135m-instruct" (embedded GGUF) or "random:<preset>"
    # (a tiny random model + char tokenizer, for tests; presets in essa_jax.models.tiny).
    c.model.path = "smollm2-135m-instruct"
    # Tokenizer path; "" = the model's.
    c.model.tokenizer = ""
    # Weights and activations: "auto" = bfloat16 on GPU / TPU (their matmul units' type; every
    # projection still accumulates in float32, `models.transformer._proj`) and float32 on CPU
    # (where bfloat16 matmuls are converted back to float32 and run slower); or either by name.
    c.model.dtype = "auto"
    # Checkpoint each decoder layer in the SFT and GRPO training passes (jax.checkpoint): the same
    # gradients, activation memory of one layer plus each layer's input, ~1 more forward of compute.
    c.model.remat = False
    # Weight-only quantisation of the base's projections (q k v o gate up down) for every program
    # after SFT: ESSA's population, GRPO's rollouts / scoring / updates (QLoRA-style: the gradient
    # reaches the adapter through the dequantised frozen weights), held-out evaluation and pass@k.
    # SFT, the warm start, trains on the float weights as loaded, so runs that differ only here
    # share one SFT adapter. "none" | "int8" (one scale per output channel) | "int4" (one per
    # `quant_group` input values); a GGUF's Q8_0 / Q4_0 / Q4_1 blocks load as they are
    # (essa_jax.models.quant; docs/ARCHITECTURE.md, "Quantised inference").
    c.model.quantize = "none"
    c.model.quant_group = 32  # int4: input values per scale (must divide every projection input)
    # The checkpoint's public name (e.g. "Qwen2.5-Math-7B"): documents the config and gives the
    # ahead-of-time plan (python -m essa_jax.plan) the model's shape (essa_jax.models.shapes) when
    # model.path holds no config.json. "" = take the shape from model.path.
    c.model.name = ""

    c.task = ml_collections.ConfigDict()
    # A generated task of essa_jax.data ("add_2d", "sub_2d", "mul_1d", "arith_mixed",
    # "word_problems", ...), or a label for a local dataset read from `path`.
    c.task.name = "add_2d"
    c.task.path = ""  # local train file / folder (gsm8k, MATH-style, generic); "" = generated
    c.task.eval_path = ""  # local held-out file; "" = split `eval_fraction` off `path`
    c.task.eval_fraction = 0.05
    # A malformed row of a task file (missing / empty question or answer, invalid JSON, no
    # extractable answer): "error" = stop with one line naming the file and row; "skip" = drop it,
    # counted in the load line and in summary.json.
    c.task.on_malformed = "error"
    # essa_jax.data prompt format: "prefill" (chat + the assistant turn started with "A + B = "),
    # "assistant" (only the assistant header + "A + B = ": the shortest), "chat", "plain" (base
    # models), "few_shot".
    c.task.prompt_format = "prefill"
    # System message: "default" = the chat template's own (SmolLM2 inserts a 16-token one); any
    # other string (also "") is sent as the system message.
    c.task.system_prompt = "default"
    c.task.instruction = ""  # appended to every question
    c.task.reward = ""  # reward name of essa_jax.rewards; "" = by format (arith / math)
    c.task.num_train = 2000
    # Held-out problems, evaluated greedily (accuracy with a 95% Wilson interval).
    c.task.num_heldout = 200
    # Longer prompts are dropped (and counted); keep prompts short, they cost every candidate.
    c.task.max_prompt_tokens = 64

    c.lora = ml_collections.ConfigDict()
    c.lora.rank = 4  # r
    c.lora.alpha = 8.0  # LoRA scale = alpha / r (PEFT's lora_alpha)
    # Adapted projections: a subset of essa_jax.models.PROJECTIONS (q k v o gate up down).
    c.lora.targets = ("q", "k", "v", "o")

    c.train = ml_collections.ConfigDict()
    # What SFT and the GRPO family train (essa_jax.lora.full.TRAINED_WEIGHTS): "lora" = the
    # adapter (LoRA factors; svdgrpo: its singular values); "full" = every weight of the model, as
    # the papers' GRPO baselines (float32 masters + AdamW state, 14 bytes per weight with the
    # bf16 base, which stays the KL reference); "projections" = the seven projections' weights
    # (embedding, head and norms frozen). Other than "lora" only for methods sft / grpo / fgrpo
    # and model.quantize = "none"; the run then exports a Hugging Face checkpoint (workdir/model).
    c.train.params = "lora"

    c.sft = ml_collections.ConfigDict()
    # LoRA SFT on the task's reference answers; loss on the answer tokens only (ESSA step 1).
    c.sft.steps = 20
    c.sft.batch_size = 16
    c.sft.learning_rate = 1e-3
    c.sft.weight_decay = 0.0
    c.sft.max_grad_norm = 1.0
    # Rows per gradient micro-batch inside one SFT step (the same update); 0 = the whole batch.
    # Must divide sft.batch_size.
    c.sft.micro_batch_size = 0

    c.essa = ml_collections.ConfigDict()
    c.essa.strategy = "cma_es"  # any name of essa_jax.es.get_strategy
    # CMA-ES only: sample population_size / 2 mirrored pairs m +- sigma y and keep the better of
    # each pair (essa_jax.es.cma_es): robust to the coarse, noisy fitness of a few prompts.
    c.essa.mirrored = False
    c.essa.population_size = 16  # lambda
    c.essa.prompts_per_candidate = 16  # fitness = mean reward on this many training prompts
    c.essa.generations = 40
    # sigma_0, relative to EACH SFT singular value (not to their RMS): the strategy searches z and
    # every evolved value is s = s_SFT (1 + z) (the ESSA loop's genomes), so 0.1 = a 10% step.
    c.essa.sigma_init = 0.1
    # Fraction of the top singular values per factor that are evolved (ESSA's alpha, 0 < a <= 1).
    c.essa.alpha = 1.0
    # Fitness rollouts: greedy decoding (deterministic fitness) or sampling at `temperature`.
    c.essa.greedy = True
    c.essa.temperature = 1.0
    # Skip `tell` when every candidate scores the same (no ranking information; see essa.py).
    c.essa.skip_flat = True
    # Fitness prompts of a generation: "shared" = every candidate scores on the same
    # prompts_per_candidate prompts (candidates are ranked on identical problems); "per_candidate"
    # = each candidate draws its own mini-batch, as the ESSA paper does (arXiv 2507.04453).
    c.essa.prompt_sampling = "shared"
    # Adam step size of strategy "openai_es" (OpenAI-ES's default 0.01); other strategies ignore it.
    c.essa.learning_rate = 0.01
    # Rows (members x prompts) each device generates at once; its rows run in chunks of at most
    # this many inside the one program (one chunk's KV cache live at a time; results unchanged).
    # 0 = the largest chunk the device memory allows (essa_jax.memory; no chunking on CPU).
    c.essa.rows_per_chunk = 0

    # The one device mesh of every program (essa_jax.mesh.make_mesh), over all processes' devices:
    # axes (pop, data, model); the population axis gets every device left over, i.e.
    # jax.device_count() / (data * model). A population that does not divide it is padded.
    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = 1  # devices along the prompt (data) axis; must divide the device count
    # Tensor-parallel axis (Megatron-style, essa_jax.mesh.param_specs): the base weights and the KV
    # cache's heads are split over this many devices in ESSA's population generation. data * model
    # must divide the device count, and model must divide num_heads, num_kv_heads and
    # intermediate_size (checked against the model's config.json, or right after loading).
    c.mesh.model = 1

    c.grpo = ml_collections.ConfigDict()
    c.grpo.steps = 40
    # Rollouts per step; must be a multiple of group_size (prompts per step = batch / group).
    c.grpo.batch_size = 32
    c.grpo.group_size = 8  # N
    # Every field below is the essa_jax.rl.GRPOConfig field of the same name (grpo_config() maps
    # them; adv_scale -> advantage, focal_gamma -> gamma), and GRPOConfig validates them.
    c.grpo.learning_rate = 1e-4
    c.grpo.weight_decay = 0.01
    c.grpo.max_grad_norm = 1.0
    c.grpo.adam_b1 = 0.9  # AdamW beta_1
    c.grpo.adam_b2 = 0.999  # AdamW beta_2
    c.grpo.adam_eps = 1e-8  # AdamW epsilon
    # Optimisation passes over each rollout batch (TRL's num_iterations); > 1 = off-policy updates,
    # with the ratio clipped (old log-probs from one extra teacher-forced pass).
    c.grpo.epochs = 1
    c.grpo.num_minibatches = 1  # updates per pass; must divide batch_size
    # Policy loss, one of essa_jax.rl.LOSS_KINDS: "grpo" (clipped ratio; DAPO = "grpo" with
    # eps_high 0.28) or "cispo" (clipped detached IS weight; the paper's eps 1.0 / 5.0).
    c.grpo.loss = "grpo"
    c.grpo.eps_low = 0.2
    c.grpo.eps_high = 0.2  # 0.28 = DAPO clip-higher
    # One of essa_jax.rl.AGGREGATIONS: "token_mean", "seq_mean_token_mean" (GRPO),
    # "seq_mean_token_sum_norm" (Dr.GRPO: token sum / (B * max_len)).
    c.grpo.agg = "token_mean"
    # Dr.GRPO's constant length normaliser of "seq_mean_token_sum_norm"; None = max_new_tokens.
    c.grpo.max_len = ml_collections.config_dict.placeholder(int)
    # Advantage estimator, a name of essa_jax.rl.estimator_names(): "group" (GRPO), "batch",
    # "none" (Dr.GRPO, no std division).
    c.grpo.adv_scale = "group"
    c.grpo.adv_eps = 1e-6  # added to the reward std (outside the square root)
    c.grpo.adv_ddof = 1  # 1 = Bessel-corrected std (TRL), 0 = population std
    # Focal exponent gamma of F-GRPO: advantages of a group times (1 - mu)^gamma (the advantage
    # weighting "focal", used by method "fgrpo"); 0 = GRPO.
    c.grpo.focal_gamma = 0.0
    # Rewards of a correct / wrong rollout: define the success rate mu of the focal weight.
    c.grpo.r_correct = 1.0
    c.grpo.r_wrong = 0.0
    # k3 KL weight to the BASE model (the adapter disabled), not the SFT policy; 0 = no KL, no
    # reference pass.
    c.grpo.beta = 0.0
    # Rollout sampling (length: generation.max_new_tokens).
    c.grpo.temperature = 1.0
    c.grpo.top_k = 0  # 0 = no top-k truncation
    c.grpo.top_p = 1.0  # 1 = no nucleus truncation
    # Old log-probs from the sampler (KV-cache decode) instead of a teacher-forced recomputation;
    # saves a forward pass when epochs * num_minibatches > 1, exact only to float rounding.
    c.grpo.use_generation_logprobs = False
    # Rollouts per gradient micro-batch inside one update (the same update: token-mean and
    # sequence-mean normalisers stay the mini-batch's); 0 = the whole mini-batch. Must divide
    # batch_size / num_minibatches.
    c.grpo.micro_batch_size = 0
    # Rollouts generated at once (one chunk's KV cache live at a time); 0 = the whole step's batch.
    # Any value > 0 samples each rollout with its own key, so all chunk sizes give the same
    # rollouts (which differ from 0's, whose batch shares one key).
    c.grpo.rows_per_chunk = 0

    c.generation = ml_collections.ConfigDict()
    # New tokens per rollout (training and evaluation); the add_2d answer is 2-3 digits + EOS.
    c.generation.max_new_tokens = 6

    c.eval = ml_collections.ConfigDict()
    c.eval.every = (
        10  # held-out eval of the current policy / ES mean every this many steps; 0 = end only
    )
    # pass@k on the held-out set at the end: `pass_k_samples` samples per problem at temperature 1,
    # unbiased estimator 1 - C(n-c, k)/C(n, k) for every k in pass_k. 0 samples = skip.
    c.eval.pass_k_samples = 0
    c.eval.pass_k = (1, 4, 16)
    c.eval.pass_k_problems = 50
    c.eval.batch_size = 100  # held-out prompts per generate call
    c.eval.base_model = False  # also report the base model's held-out accuracy (no adapter)

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every = 10  # steps between checkpoints (and at the end); 0 = end only
    c.checkpoint.keep = 2
    c.log_every = 1
    return c


def search_seed(config) -> int:
    """The training loop's seed: `config.search_seed`, or `config.seed` when it is -1."""
    return int(config.seed if config.search_seed < 0 else config.search_seed)


def model_dims(config) -> dict[str, tuple[int, int]] | None:
    """(in, out) of every LoRA target, read cheaply (no weights) from the model's config.

    Returns None when the config cannot be read without loading weights (then the rank is checked
    after loading, still before compilation).
    """
    mcfg = peek_model_config(config.model.path)
    if mcfg is None:
        return None
    return mcfg.projection_shapes()


@functools.lru_cache(maxsize=16)
def peek_model_config(path: str):
    """The ModelConfig of `path` without reading weights; None if it needs a full load."""
    from essa_jax.models.config import ModelConfig

    if path.startswith(RANDOM_PREFIX):
        from essa_jax.models.tiny import tiny_model_config

        return tiny_model_config(path[len(RANDOM_PREFIX) :])
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json")):
        with open(os.path.join(path, "config.json")) as f:
            return ModelConfig.from_hf_dict(json.load(f))
    from essa_jax.models.hub import resolve_name

    resolved = resolve_name(path)
    if resolved.is_file() and resolved.suffix == ".gguf":
        # GGUF header only: the reader memory-maps tensors, nothing is dequantised.
        import gguf

        from essa_jax.models.loading import CheckpointError, gguf_config

        try:
            reader = gguf.GGUFReader(str(resolved))
        except (ValueError, OSError) as e:  # not GGUF, or truncated
            raise CheckpointError(
                f"{resolved}: not a readable GGUF file ({e}); model.path takes a llama.cpp .gguf "
                "file, a Hugging Face checkpoint directory (config.json + *.safetensors), "
                "'smollm2-135m-instruct' or 'random:<preset>'"
            ) from None
        return gguf_config(reader)
    return None


def _peek_or_none(path: str):
    """`peek_model_config(path)`, or None when the shape cannot be read without the weights."""
    try:
        return peek_model_config(path)
    except (FileNotFoundError, OSError, ValueError, ImportError):
        return None


def _check_choice(field: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise ConfigError(field, value, " | ".join(repr(c) for c in choices))


def _check_positive(field: str, value: Any, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, int | float) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ConfigError(field, value, "numbers >= 0" if allow_zero else "numbers > 0")


def _check_model_path(path: str) -> None:
    if not path or path == UNSET or UNSET in path:
        raise ConfigError(
            "model.path",
            path,
            "a local HF checkpoint directory, a .gguf file, 'smollm2-135m-instruct' or "
            "'random:<preset>'",
            "set --config.model.path=/path/to/checkpoint (nothing is downloaded at run time)",
        )
    if path.startswith(RANDOM_PREFIX):
        from essa_jax.models.tiny import TINY_PRESETS

        _check_choice("model.path", path, [RANDOM_PREFIX + p for p in TINY_PRESETS])
        return
    from essa_jax.models.hub import resolve_name

    try:
        resolved = resolve_name(path)
    except FileNotFoundError as e:
        raise ConfigError("model.path", path, "an installed embedded model", str(e)) from e
    if not resolved.exists():
        raise ConfigError(
            "model.path",
            path,
            "an existing local HF checkpoint directory or .gguf file, "
            "'smollm2-135m-instruct' or 'random:<preset>'",
            "set --config.model.path=/path/to/checkpoint (nothing is downloaded at run time)",
        )


def check_task_config(task, *, check_paths: bool = True) -> None:
    """Validate `config.task` (name / path, prompt format, reward) without reading the data;
    `check_paths=False` skips whether the data files exist (a plan needs none)."""
    from essa_jax.data import PROMPT_FORMATS, is_generated_task
    from essa_jax.rewards import REWARDS

    if task.prompt_format not in PROMPT_FORMATS:
        raise ConfigError(
            "task.prompt_format", task.prompt_format, " | ".join(map(repr, PROMPT_FORMATS))
        )
    _check_choice("task.on_malformed", task.on_malformed, ("error", "skip"))
    if task.reward and task.reward not in REWARDS:
        raise ConfigError("task.reward", task.reward, "'' (by format) | " + " | ".join(REWARDS))
    if (is_generated_task(task.name) and not task.path) or not check_paths:
        return
    for field, path in (("task.path", task.path), ("task.eval_path", task.eval_path)):
        if field == "task.eval_path" and not path:
            continue
        if not path or UNSET in path or not os.path.exists(path):
            raise ConfigError(
                field,
                path,
                "an existing local dataset file or folder",
                f"task {task.name!r} is read from disk: set --config.{field}=/path/to/data "
                "(nothing is downloaded at run time); generated tasks need no path: add_<n>d, "
                "sub_<n>d, mul_<n>d, arith_mixed, word_problems",
            )
    if not task.eval_path and not 0.0 < task.eval_fraction < 1.0:
        raise ConfigError(
            "task.eval_fraction", task.eval_fraction, "0 < f < 1 (held-out split of task.path)"
        )


def _check_mesh(mesh, num_devices: int, model_config: Any = None) -> None:
    """`config.mesh` against the device count of all processes (essa_jax.mesh.make_mesh) and,
    when known, the model's heads (`check_mesh_model`)."""
    data = mesh.data
    if isinstance(data, bool) or not isinstance(data, int) or data < 1 or num_devices % data:
        divisors = [d for d in range(1, num_devices + 1) if num_devices % d == 0]
        raise ConfigError(
            "mesh.data",
            data,
            f"divisors of the {num_devices} device(s) of all processes: {divisors}",
            "the population axis gets the remaining devices, device_count / mesh.data",
        )
    check_mesh_model(mesh, num_devices, model_config)


def check_mesh_model(mesh, num_devices: int, model_config: Any = None) -> None:
    """`config.mesh.model` (tensor parallelism): an int >= 1 with data * model dividing the
    `num_devices` of all processes and, when `model_config` is given (a `ModelConfig`, or any
    object with num_heads / num_kv_heads / intermediate_size), dividing the model's heads and MLP
    columns (`essa_jax.mesh.check_model_axis`). `validate_config` calls it with the model's
    config.json when it can be read without the weights; the ESSA loop calls it again with the
    loaded model's config, so a shape known only after loading fails with the same message."""
    from essa_jax.mesh import model_axis_values

    data, model = mesh.data, mesh.model
    per_data = num_devices // data
    valid = [m for m in range(1, per_data + 1) if per_data % m == 0]
    about = f"divisors of the {num_devices} device(s) / mesh.data={data}"
    if model_config is not None:
        heads = model_axis_values(model_config)
        valid = [m for m in valid if m in heads]
        about += (
            f" that divide num_heads={model_config.num_heads}, num_kv_heads="
            f"{model_config.num_kv_heads} and intermediate_size={model_config.intermediate_size}"
        )
    if isinstance(model, bool) or not isinstance(model, int) or model not in valid:
        raise ConfigError("mesh.model", model, f"{valid} ({about})")


def check_quantization(model, model_config: Any = None) -> None:
    """`model.quantize` and, for int4, `model.quant_group` (against the projections' input sizes
    when the model's shape is given or can be read without its weights). The pipeline calls it
    again with the loaded model's shape, for checkpoints whose header validation could not read."""
    from essa_jax.models.quant import QUANT_MODES, check_group

    _check_choice("model.quantize", model.quantize, QUANT_MODES)
    group = model.quant_group
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ConfigError("model.quant_group", group, "integers >= 1 (32 = GGUF's block)")
    if model.quantize != "int4":
        return
    shape = model_config if model_config is not None else _peek_or_none(model.path)
    if shape is not None:
        try:
            check_group(shape, group)
        except ValueError as e:
            valid = str(e).split("valid values are ")[1]
            raise ConfigError("model.quant_group", group, valid) from None


def check_trained_params(config) -> None:
    """`train.params` against the method and the base's form (`lora.full`)."""
    from essa_jax.lora.full import TRAINED_WEIGHTS

    _check_choice("train.params", config.train.params, TRAINED_WEIGHTS)
    if config.train.params == "lora":
        return
    if config.method not in FULL_PARAM_METHODS:
        raise ConfigError(
            "train.params",
            config.train.params,
            f"'lora' for method {config.method!r}",
            f"the weights are trained by methods {' | '.join(FULL_PARAM_METHODS)}",
        )
    if config.model.quantize != "none":
        raise ConfigError(
            "train.params",
            config.train.params,
            f"'lora' with model.quantize = {config.model.quantize!r}",
            "quantised weights have no gradient: set model.quantize = 'none'",
        )


def validate_config(config, num_devices: int | None = None, *, model_config: Any = None) -> None:
    """Check every field against the others and the model's dims; raise ConfigError on the first.

    Runs before any weight is loaded or any function compiled. `num_devices` defaults to
    `jax.device_count()`: the run's one mesh spans every process's devices. `model_config` (a
    `ModelConfig`): check against this shape instead of reading `model.path`; then neither the
    checkpoint nor the task's data files need exist (the ahead-of-time plan of a cluster's run,
    `essa_jax.plan`).
    """
    _check_choice("method", config.method, METHODS)
    _check_choice("model.dtype", config.model.dtype, DTYPES)
    if model_config is None:
        _check_model_path(config.model.path)
    if not isinstance(config.seed, int):
        raise ConfigError("seed", config.seed, "integers")
    if not isinstance(config.search_seed, int) or config.search_seed < -1:
        raise ConfigError("search_seed", config.search_seed, "-1 (= seed) or integers >= 0")
    _check_positive("max_wall_seconds", config.max_wall_seconds, allow_zero=True)

    # Task.
    check_task_config(config.task, check_paths=model_config is None)
    _check_positive("task.num_train", config.task.num_train)
    _check_positive("task.num_heldout", config.task.num_heldout)
    _check_positive("task.max_prompt_tokens", config.task.max_prompt_tokens)
    _check_positive("generation.max_new_tokens", config.generation.max_new_tokens)

    # LoRA: the targets are the model's projections.
    from essa_jax.models.config import PROJECTIONS

    targets = tuple(config.lora.targets)
    if (
        not targets
        or any(t not in PROJECTIONS for t in targets)
        or len(set(targets)) != len(targets)
    ):
        raise ConfigError("lora.targets", targets, f"non-empty distinct subsets of {PROJECTIONS}")
    if not isinstance(config.lora.rank, int) or config.lora.rank < 1:
        raise ConfigError("lora.rank", config.lora.rank, "integers >= 1")
    _check_positive("lora.alpha", config.lora.alpha)
    dims = model_config.projection_shapes() if model_config is not None else model_dims(config)
    if dims is not None:
        max_rank = min(min(dims[t]) for t in targets)
        if config.lora.rank > max_rank:
            raise ConfigError(
                "lora.rank",
                config.lora.rank,
                f"1..{max_rank} (the smallest dim of the targets {targets} of {config.model.path})",
            )

    # SFT.
    if not isinstance(config.sft.steps, int) or config.sft.steps < 0:
        raise ConfigError("sft.steps", config.sft.steps, "integers >= 0")
    if config.method in ("essa", "svdgrpo", "sft") and config.sft.steps == 0:
        raise ConfigError(
            "sft.steps",
            0,
            "integers >= 1 for method " + repr(config.method),
            "ESSA needs an SFT warm start: singular values of a zero-initialised LoRA B are all 0",
        )
    _check_positive("sft.batch_size", config.sft.batch_size)
    mbs = config.sft.micro_batch_size
    if not isinstance(mbs, int) or isinstance(mbs, bool) or mbs < 0:
        raise ConfigError("sft.micro_batch_size", mbs, "integers >= 0 (rows per device; 0 = all)")
    if not isinstance(config.model.remat, bool):
        raise ConfigError("model.remat", config.model.remat, "True | False")
    check_quantization(config.model, model_config)
    check_trained_params(config)
    _check_positive("sft.learning_rate", config.sft.learning_rate)

    num_devices = _device_count() if num_devices is None else num_devices
    shape = model_config
    if shape is None and config.mesh.model != 1:
        shape = _peek_or_none(config.model.path)  # else checked after loading (ESSALoop)
    _check_mesh(config.mesh, num_devices, shape)
    if config.method == "essa":
        e = config.essa
        from essa_jax.es import get_strategy  # noqa: F401 - import error names the missing package

        if not isinstance(e.population_size, int) or e.population_size < 2:
            raise ConfigError("essa.population_size", e.population_size, "integers >= 2")
        _check_choice("essa.prompt_sampling", e.prompt_sampling, PROMPT_SAMPLINGS)
        _check_positive("essa.learning_rate", e.learning_rate)
        if e.mirrored and e.strategy != "cma_es":
            raise ConfigError(
                "essa.mirrored", e.mirrored, "False for strategy " + repr(e.strategy),
                "mirrored pairs with pairwise selection are implemented for 'cma_es' "
                "(openai_es is antithetic already)",
            )  # fmt: skip
        if e.mirrored and e.population_size % 2:
            raise ConfigError(
                "essa.population_size", e.population_size, "even sizes with essa.mirrored=True"
            )
        _check_positive("essa.prompts_per_candidate", e.prompts_per_candidate)
        _check_positive("essa.generations", e.generations)
        rpc = e.rows_per_chunk
        if isinstance(rpc, bool) or not isinstance(rpc, int) or rpc < 0:
            raise ConfigError(
                "essa.rows_per_chunk", rpc, "integers >= 0 (0 = chosen from device memory)"
            )
        _check_positive("essa.sigma_init", e.sigma_init)
        if not 0.0 < e.alpha <= 1.0:
            raise ConfigError("essa.alpha", e.alpha, "0 < alpha <= 1")
        if e.alpha * config.lora.rank < 1:
            raise ConfigError(
                "essa.alpha", e.alpha, f">= 1/rank = {1 / config.lora.rank:g} (at least one value)"
            )
    if config.method in ("grpo", "fgrpo", "svdgrpo"):
        g = config.grpo
        _check_positive("grpo.steps", g.steps)
        if config.method in ("grpo", "svdgrpo") and g.focal_gamma != 0:
            raise ConfigError(
                "grpo.focal_gamma",
                g.focal_gamma,
                f"0 for method {config.method!r}",
                "focal weights make it F-GRPO: use --config.method=fgrpo",
            )
        if config.method == "fgrpo" and g.focal_gamma == 0:
            raise ConfigError(
                "grpo.focal_gamma", 0.0, "> 0 for method 'fgrpo' (0 is plain GRPO)", "e.g. 0.5"
            )
        # The RL settings validate themselves: GRPOConfig's error names its field.
        from essa_jax.rl import GRPOConfigError

        try:
            grpo_config(config)
        except GRPOConfigError as e:
            field = GRPO_CONFIG_FIELDS.get(e.field, "grpo." + e.field)
            raise ConfigError(field, e.value, e.valid, e.hint) from e
        if not isinstance(g.batch_size, int) or g.batch_size % g.group_size or g.batch_size <= 0:
            raise ConfigError(
                "grpo.batch_size",
                g.batch_size,
                f"positive multiples of grpo.group_size={g.group_size}",
            )
        if g.batch_size % g.num_minibatches:
            raise ConfigError(
                "grpo.num_minibatches",
                g.num_minibatches,
                f"divisors of grpo.batch_size={g.batch_size} (the rollouts of a step)",
            )
    ev = config.eval
    _check_positive("eval.every", ev.every, allow_zero=True)
    _check_positive("eval.pass_k_samples", ev.pass_k_samples, allow_zero=True)
    if ev.pass_k_samples:
        ks = tuple(ev.pass_k)
        if not ks or any((not isinstance(k, int)) or k < 1 or k > ev.pass_k_samples for k in ks):
            raise ConfigError(
                "eval.pass_k", ks, f"non-empty tuples of ints in 1..{ev.pass_k_samples}"
            )
    _check_positive("eval.batch_size", ev.batch_size)
    _check_positive("checkpoint.every", config.checkpoint.every, allow_zero=True)
    _check_positive("checkpoint.keep", config.checkpoint.keep)
    # Last: the batch fields it reads are valid by now. Micro-batches count rows per device.
    check_micro_batches(config, num_devices // config.mesh.model if num_devices > 1 else 1)


# Where the experiment config holds each essa_jax.rl.GRPOConfig field other than grpo.<same name>.
# "method": the weighting is "focal" for method "fgrpo", else "none" (validate_config checks that
# focal_gamma is > 0 exactly for fgrpo).
GRPO_CONFIG_FIELDS = {
    "advantage": "grpo.adv_scale",
    "gamma": "grpo.focal_gamma",
    "max_new_tokens": "generation.max_new_tokens",
    "remat": "model.remat",
    "weighting": "method",
}


def check_micro_batches(config, data: int) -> None:
    """`sft.micro_batch_size` and `grpo.micro_batch_size` against the rows each device holds: they
    count rows per device (ceil(batch / data) on a mesh with `data` devices along its data axis,
    docs/ARCHITECTURE.md "Data-parallel GRPO and SFT"); raises ConfigError naming the field."""
    from essa_jax.mesh import rows_per_device_problem
    from essa_jax.rl import GRPOConfigError

    mbs, batch = int(config.sft.micro_batch_size), int(config.sft.batch_size)
    valid = rows_per_device_problem(mbs, batch, data, "rows", f"sft.batch_size={batch}")
    if valid is not None:
        raise ConfigError("sft.micro_batch_size", mbs, valid)
    if config.method in ("grpo", "fgrpo", "svdgrpo"):
        try:
            grpo_config(config).check_batch(int(config.grpo.batch_size), data)
        except GRPOConfigError as e:
            raise ConfigError(f"grpo.{e.field}", e.value, e.valid, e.hint) from e


def grpo_config(config):
    """The essa_jax.rl.GRPOConfig of an experiment config: every field of it, read mechanically
    from `config.grpo.<field>` or the place GRPO_CONFIG_FIELDS names. Raises GRPOConfigError (a
    ValueError naming the GRPOConfig field) on an invalid value; validate_config turns it into a
    ConfigError naming the config field."""
    import dataclasses

    from essa_jax.rl import GRPOConfig

    kwargs = {}
    for f in dataclasses.fields(GRPOConfig):
        path = GRPO_CONFIG_FIELDS.get(f.name, "grpo." + f.name)
        if path == "method":
            kwargs[f.name] = "focal" if config.method == "fgrpo" else "none"
            continue
        block, name = path.split(".")
        if name not in config[block]:
            raise KeyError(f"GRPOConfig.{f.name} has no config field {path}: add it to base_config")
        kwargs[f.name] = config[block][name]
    return GRPOConfig(**kwargs)


def _device_count() -> int:
    import jax

    return jax.device_count()


def load_config_file(path: str, *args: str) -> ml_collections.ConfigDict:
    """`get_config(*args)` of a config file; configs build on one another with it, e.g.
    `load_config_file(os.path.join(os.path.dirname(__file__), "grpo_smollm2_arith.py"))`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "essa_jax_config_" + os.path.basename(path)[:-3], path
    )
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"no config file at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(*args)
