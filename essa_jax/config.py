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
DTYPES = ("float32", "bfloat16")
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
LOSS_KINDS = ("grpo", "cispo")
LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
ADV_SCALES = ("group", "batch", "none")
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
    # Wall-clock budget of the ES / RL phase in seconds (after SFT); 0 = none. Both loops stop at
    # the first step boundary past it, so equal budgets compare methods at equal cost.
    c.max_wall_seconds = 0.0

    c.model = ml_collections.ConfigDict()
    # HF checkpoint dir, .gguf file, "smollm2-135m-instruct" (embedded GGUF) or "random:<preset>"
    # (a tiny random model + char tokenizer, for tests; presets in essa_jax.train.tiny).
    c.model.path = "smollm2-135m-instruct"
    # Tokenizer path; "" = the model's.
    c.model.tokenizer = ""
    c.model.dtype = "float32"

    c.task = ml_collections.ConfigDict()
    # A generated task of essa_jax.data ("add_2d", "sub_2d", "mul_1d", "arith_mixed",
    # "word_problems", ...), or a label for a local dataset read from `path`.
    c.task.name = "add_2d"
    c.task.path = ""  # local train file / folder (gsm8k, MATH-style, generic); "" = generated
    c.task.eval_path = ""  # local held-out file; "" = split `eval_fraction` off `path`
    c.task.eval_fraction = 0.05
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
    c.lora.targets = ("q", "k", "v", "o")

    c.sft = ml_collections.ConfigDict()
    # LoRA SFT on the task's reference answers; loss on the answer tokens only (ESSA step 1).
    c.sft.steps = 20
    c.sft.batch_size = 16
    c.sft.learning_rate = 1e-3
    c.sft.weight_decay = 0.0
    c.sft.max_grad_norm = 1.0

    c.essa = ml_collections.ConfigDict()
    c.essa.strategy = "cma_es"  # any name of essa_jax.es.get_strategy
    # CMA-ES only: sample population_size / 2 mirrored pairs m +- sigma y and keep the better of
    # each pair (essa_jax.es.cma_es): robust to the coarse, noisy fitness of a few prompts.
    c.essa.mirrored = False
    c.essa.population_size = 16  # lambda
    c.essa.prompts_per_candidate = 16  # fitness = mean reward on this many training prompts
    c.essa.generations = 40
    # sigma_0 relative to the RMS of the SFT singular values (the genome is an offset on them).
    c.essa.sigma_init = 0.1
    # Fraction of the top singular values per factor that are evolved (ESSA's alpha, 0 < a <= 1).
    c.essa.alpha = 1.0
    # Fitness rollouts: greedy decoding (deterministic fitness) or sampling at `temperature`.
    c.essa.greedy = True
    c.essa.temperature = 1.0
    # Skip `tell` when every candidate scores the same (no ranking information; see essa.py).
    c.essa.skip_flat = True
    # Devices the population is split over (evaluate_population shards members); 0 = all devices.
    c.essa.population_devices = 1

    c.grpo = ml_collections.ConfigDict()
    c.grpo.steps = 40
    # Rollouts per step; must be a multiple of group_size (prompts per step = batch / group).
    c.grpo.batch_size = 32
    c.grpo.group_size = 8  # N
    c.grpo.learning_rate = 1e-4
    c.grpo.weight_decay = 0.01
    c.grpo.max_grad_norm = 1.0
    c.grpo.loss = "grpo"  # "grpo" (clipped ratio) or "cispo"
    c.grpo.eps_low = 0.2
    c.grpo.eps_high = 0.2  # 0.28 = DAPO clip-higher
    c.grpo.agg = "token_mean"
    c.grpo.adv_scale = "group"  # "group" (GRPO), "batch", "none" (Dr.GRPO)
    # Focal exponent gamma of F-GRPO: advantages of a group times (1 - mu)^gamma; 0 = GRPO.
    c.grpo.focal_gamma = 0.0
    c.grpo.beta = 0.0  # KL weight to the SFT policy (k3 estimator); 0 = no KL, no reference pass
    c.grpo.temperature = 1.0

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


def model_dims(config) -> dict[str, tuple[int, int]] | None:
    """(in, out) of every LoRA target, read cheaply (no weights) from the model's config.

    Returns None when the config cannot be read without loading weights (then the rank is checked
    after loading, still before compilation).
    """
    mcfg = peek_model_config(config.model.path)
    if mcfg is None:
        return None
    d, i, hd = mcfg.hidden_size, mcfg.intermediate_size, mcfg.head_dim
    q, kv = mcfg.num_heads * hd, mcfg.num_kv_heads * hd
    return {
        "q": (d, q),
        "k": (d, kv),
        "v": (d, kv),
        "o": (q, d),
        "gate": (d, i),
        "up": (d, i),
        "down": (i, d),
    }


@functools.lru_cache(maxsize=16)
def peek_model_config(path: str):
    """The ModelConfig of `path` without reading weights; None if it needs a full load."""
    from essa_jax.models.config import ModelConfig

    if path.startswith(RANDOM_PREFIX):
        from essa_jax.train.tiny import tiny_model_config

        return tiny_model_config(path[len(RANDOM_PREFIX) :])
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json")):
        with open(os.path.join(path, "config.json")) as f:
            return ModelConfig.from_hf_dict(json.load(f))
    from essa_jax.models.hub import resolve_name

    resolved = resolve_name(path)
    if resolved.is_file() and resolved.suffix == ".gguf":
        # GGUF header only: the reader memory-maps tensors, nothing is dequantised.
        import gguf

        from essa_jax.models.loading import gguf_config

        return gguf_config(gguf.GGUFReader(str(resolved)))
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
        from essa_jax.train.tiny import TINY_PRESETS

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


def validate_config(config, num_devices: int | None = None) -> None:
    """Check every field against the others and the model's dims; raise ConfigError on the first.

    Runs before any weight is loaded or any function compiled. `num_devices` defaults to
    `jax.local_device_count()`: each process splits its share of the population over its own
    devices (across processes only the fitness vector travels).
    """
    _check_choice("method", config.method, METHODS)
    _check_choice("model.dtype", config.model.dtype, DTYPES)
    _check_model_path(config.model.path)
    if not isinstance(config.seed, int):
        raise ConfigError("seed", config.seed, "integers")
    _check_positive("max_wall_seconds", config.max_wall_seconds, allow_zero=True)

    # Task.
    from essa_jax.train.tasks import check_task_config

    check_task_config(config.task)
    _check_positive("task.num_train", config.task.num_train)
    _check_positive("task.num_heldout", config.task.num_heldout)
    _check_positive("task.max_prompt_tokens", config.task.max_prompt_tokens)
    _check_positive("generation.max_new_tokens", config.generation.max_new_tokens)

    # LoRA.
    targets = tuple(config.lora.targets)
    if (
        not targets
        or any(t not in LORA_TARGETS for t in targets)
        or len(set(targets)) != len(targets)
    ):
        raise ConfigError("lora.targets", targets, f"non-empty distinct subsets of {LORA_TARGETS}")
    if not isinstance(config.lora.rank, int) or config.lora.rank < 1:
        raise ConfigError("lora.rank", config.lora.rank, "integers >= 1")
    _check_positive("lora.alpha", config.lora.alpha)
    dims = model_dims(config)
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
    _check_positive("sft.learning_rate", config.sft.learning_rate)

    num_devices = _device_count() if num_devices is None else num_devices
    if config.method == "essa":
        e = config.essa
        from essa_jax.es import get_strategy  # noqa: F401 - import error names the missing package

        if not isinstance(e.population_size, int) or e.population_size < 2:
            raise ConfigError("essa.population_size", e.population_size, "integers >= 2")
        if not isinstance(e.population_devices, int) or not 0 <= e.population_devices:
            raise ConfigError("essa.population_devices", e.population_devices, "integers >= 0")
        shards = num_devices if e.population_devices == 0 else e.population_devices
        if shards > num_devices:
            raise ConfigError(
                "essa.population_devices",
                e.population_devices,
                f"0..{num_devices} (this process's devices)",
            )
        if e.population_size % shards:
            valid = [p for p in range(shards, 4 * shards + 1, shards)]
            raise ConfigError(
                "essa.population_size",
                e.population_size,
                f"multiples of {shards} (the population is split over {shards} device(s)), "
                f"e.g. {valid}",
            )
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
        if not isinstance(g.group_size, int) or g.group_size < 2:
            raise ConfigError(
                "grpo.group_size", g.group_size, "integers >= 2 (group-relative advantages)"
            )
        if not isinstance(g.batch_size, int) or g.batch_size % g.group_size or g.batch_size <= 0:
            raise ConfigError(
                "grpo.batch_size",
                g.batch_size,
                f"positive multiples of grpo.group_size={g.group_size}",
            )
        _check_positive("grpo.learning_rate", g.learning_rate)
        _check_choice("grpo.loss", g.loss, LOSS_KINDS)
        _check_choice("grpo.agg", g.agg, LOSS_AGGS)
        _check_choice("grpo.adv_scale", g.adv_scale, ADV_SCALES)
        _check_positive("grpo.focal_gamma", g.focal_gamma, allow_zero=True)
        _check_positive("grpo.beta", g.beta, allow_zero=True)
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


def _device_count() -> int:
    import jax

    return jax.local_device_count()


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
