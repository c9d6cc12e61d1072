"""Experiment configuration: the schema every experiment config fills in, and its validation.

Every file in `experiments/configs/` starts from `base_config()` (all fields, with defaults and a
comment each), overrides what the experiment needs and returns the result from `get_config()`.
`essa_jax.main` locks the config (ml_collections refuses an unknown `--config.x=...` field)
and calls `essa_jax.train.validate_config` before any model is loaded or any function compiled:
`check_fields` here (the schema, `check_schema`, and every field no method owns), then the
method object's checks of its own section. A wrong field fails in a second with a message naming
the field, the value given and the values that are valid.

Symbols follow the papers: ESSA (arXiv 2507.04453) for `lora` / `essa`, F-GRPO (arXiv 2602.06717)
for `grpo` (N = group_size, gamma = focal_gamma, eps_low / eps_high, beta).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import ml_collections

DTYPES = ("auto", "float32", "bfloat16")
# Placeholder for configs that need a user's local checkpoint or dataset: fails validation.
UNSET = "<set me>"


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
    # A name of the method registry (essa_jax.train.methods; `register_method` adds one):
    # "essa": SFT LoRA -> SVD -> CMA-ES on singular values (ESSA, Alg. 1).
    # "grpo": SFT LoRA -> GRPO on the LoRA factors; "fgrpo" = "grpo" with grpo.weighting "focal"
    #         (F-GRPO; focal_gamma > 0).
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
    # The same budget in the process's own CPU seconds spent in the loop's steps (time.process_time:
    # every thread of this process, no other process): on a shared or loaded host elapsed time
    # counts the neighbours' work too, CPU seconds do not. 0 = none; with both, the first reached.
    c.max_cpu_seconds = 0.0

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
    # A completion the reward cannot score (it raises, returns NaN / inf or times out) scores 0.0
    # and is counted: per step in metrics.jsonl (reward_failures, reward_nonfinite, reward_raised,
    # reward_timeouts), for the run in summary.json, with a warning line. Above this fraction of
    # the completions scored, beyond chance (essa_jax.rewards.over_failure_limit), the reward
    # is broken: the run stops with one line naming it (exit 2), its checkpoints kept. 0 = stop on
    # the first failure; 1 = never stop.
    c.task.max_reward_failure_fraction = 0.1
    c.task.num_train = 2000
    # Held-out problems, evaluated greedily (accuracy with a 95% Wilson interval).
    c.task.num_heldout = 200
    # Validation problems (0 = no validation split): carved from the training stream, disjoint from
    # train and held-out up to swapped operands (essa_jax.data.canonical_key). With them the
    # periodic evaluations and SFT's early stopping read validation, and the held-out (test) set
    # is read once per policy: the SFT start and the final policy (docs/STUDIES.md).
    c.task.num_validation = 0
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
    # What SFT trains when train.params is not "lora": "same" = those weights (full-parameter
    # SFT, at sft.learning_rate: its default 1e-3 suits an adapter; AdamW on every weight wants
    # ~1e-5, so set it with this choice); "lora" = a LoRA adapter (lora.*, sft.*) as the adapter
    # methods train it, then folded into the weights (lora.full.merged_masters) that the
    # full-parameter loop starts from, so every method of a comparison starts from the same SFT
    # model (same config.seed, same adapter).
    c.train.sft_params = "same"

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
    # Early stopping on the validation split (task.num_validation > 0): a greedy validation
    # evaluation every `eval_every` SFT steps (0 = none); SFT returns the adapter of the best one
    # (ties: the earlier) and ends after `patience` evaluations without improvement (0 = never
    # early: all sft.steps run, the best is still returned).
    c.sft.eval_every = 0
    c.sft.patience = 0
    # A PEFT adapter folder (e.g. an SFT run's <workdir>/adapter) taken as the SFT result instead of
    # training one: runs of a study share one converged SFT start. Its rank / alpha / targets must
    # equal lora.*. "" = train it here.
    c.sft.init_from = ""

    c.essa = ml_collections.ConfigDict()
    # A name of the strategy registry (essa_jax.es.STRATEGIES: "cma_es", "sep_cma_es",
    # "openai_es", or one a module the config file imports registers with register_strategy).
    c.essa.strategy = "cma_es"
    # The strategy's own constructor arguments beyond the fields below (num_dims and
    # population_size come from the run), e.g. {"decay": 0.97} for a user's strategy; checked by
    # building the strategy before any weight is read. Set it in the config file: a key that
    # exists there can then be overridden with --config.essa.strategy_args.<key>=...
    c.essa.strategy_args = {}
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
    # Stop (one line, exit 2, checkpoints kept) after this many generations in a row in which
    # every candidate tied: a reward that cannot tell candidates apart, or a sigma too small to
    # change an answer, searches nothing. 0 = never stop.
    c.essa.max_flat_generations = 20
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
    # Advantage weighting, a name of essa_jax.rl.weighting_names(): "none" (GRPO), "focal"
    # (F-GRPO's (1 - mu)^gamma; method "fgrpo" selects it), or one a module the config file
    # imports registers with essa_jax.rl.register_weighting.
    c.grpo.weighting = "none"
    # The weighting's own parameters, read by it as GRPOConfig.weighting_kwargs (e.g.
    # {"threshold": 0.5}); set in the config file, like essa.strategy_args.
    c.grpo.weighting_args = {}
    # Focal exponent gamma of weighting "focal": a group's advantages times (1 - mu)^gamma.
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
    # Also a held-out eval once this many seconds of loop clock (wall_s: SFT and evaluations
    # excluded) have passed since the last one; 0 = off. With eval.every both apply (one eval when
    # both are due): equal-wall-clock comparisons of methods whose steps differ in cost.
    c.eval.every_seconds = 0.0
    # pass@k on the held-out set at the end: `pass_k_samples` samples per problem at temperature 1,
    # unbiased estimator 1 - C(n-c, k)/C(n, k) for every k in pass_k. 0 samples = skip.
    c.eval.pass_k_samples = 0
    c.eval.pass_k = (1, 4, 16)
    c.eval.pass_k_problems = 50
    c.eval.batch_size = 100  # held-out prompts per generate call
    c.eval.base_model = False  # also report the base model's held-out accuracy (no adapter)
    # Completions written per held-out evaluation to <workdir>/eval_samples.jsonl (the first this
    # many problems: prompt, completion, gold answer, reward, step, which evaluation); 0 = none.
    c.eval.samples_to_log = 8
    # With a validation split: read the held-out (test) set at the end (the final policy's
    # accuracy, pass@k). False for a study's tuning runs, which are chosen on validation and never
    # read test: their summary's final accuracy is then the validation one (`final_split`).
    c.eval.read_test = True

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every = 10  # steps between checkpoints (and at the end); 0 = end only
    c.checkpoint.keep = 2
    # SIGTERM / SIGINT (a preempted VM, Slurm, Kubernetes, Ctrl-C): the run finishes the step in
    # progress, checkpoints it and exits with 128 + the signal (143 / 130). If that takes longer
    # than this many seconds (or a second signal comes), it exits at once without a checkpoint and
    # resumes from the previous one (essa_jax.preemption). Keep it below the scheduler's grace
    # period (Kubernetes: 30 s by default; Slurm: KillWait).
    c.checkpoint.preempt_seconds = 25.0
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
    """`essa_jax.models.peek_model_config(path)`, memoised: validation reads a header once."""
    from essa_jax.models.loading import peek_model_config as peek

    return peek(path)


def peek_or_none(path: str):
    """`peek_model_config(path)`, or None when the shape cannot be read without the weights."""
    try:
        return peek_model_config(path)
    except (FileNotFoundError, OSError, ValueError, ImportError):
        return None


def check_choice(field: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise ConfigError(field, value, " | ".join(repr(c) for c in choices))


def check_positive(field: str, value: Any, *, allow_zero: bool = False) -> None:
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
    from essa_jax.models.loading import RANDOM_PREFIX

    if path.startswith(RANDOM_PREFIX):
        from essa_jax.models.tiny import TINY_PRESETS

        check_choice("model.path", path, [RANDOM_PREFIX + p for p in TINY_PRESETS])
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
    check_choice("task.on_malformed", task.on_malformed, ("error", "skip"))
    if task.reward and task.reward not in REWARDS:
        raise ConfigError("task.reward", task.reward, "'' (by format) | " + " | ".join(REWARDS))
    limit = task.get("max_reward_failure_fraction", 0.1)
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int | float)
        or not 0.0 <= limit <= 1.0  # NaN fails this too
    ):
        raise ConfigError(
            "task.max_reward_failure_fraction",
            limit,
            "fractions 0 <= f <= 1 (0: stop on the first failed completion; 1: never stop)",
        )
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
                "sub_<n>d, mul_<n>d, arith_mixed[_l1|_l2|_l3], word_problems[_l1|_l2|_l3], "
                "instructions[_ood][_l1|_l2]",
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

    check_choice("model.quantize", model.quantize, QUANT_MODES)
    group = model.quant_group
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ConfigError("model.quant_group", group, "integers >= 1 (32 = GGUF's block)")
    if model.quantize != "int4":
        return
    shape = model_config if model_config is not None else peek_or_none(model.path)
    if shape is not None:
        try:
            check_group(shape, group)
        except ValueError as e:
            valid = str(e).split("valid values are ")[1]
            raise ConfigError("model.quant_group", group, valid) from None


def check_trained_params(config) -> None:
    """`train.params` against its choices and the base's form (`lora.full`); whether the method
    can train the weights is the method's check (`essa_jax.train.methods`)."""
    from essa_jax.lora.full import SFT_PARAMS, TRAINED_WEIGHTS

    check_choice("train.params", config.train.params, TRAINED_WEIGHTS)
    check_choice("train.sft_params", config.train.sft_params, SFT_PARAMS)
    if config.train.params != "lora" and config.model.quantize != "none":
        raise ConfigError(
            "train.params",
            config.train.params,
            f"'lora' with model.quantize = {config.model.quantize!r}",
            "quantised weights have no gradient: set model.quantize = 'none'",
        )


def check_fields(config, num_devices: int | None = None, *, model_config: Any = None) -> None:
    """Check the schema (`check_schema`) and every field no method owns (model, task, lora, sft,
    mesh, eval, checkpoint) against the others and the model's dims; raise ConfigError on the
    first. The method's own section is its object's to check: `essa_jax.train.validate_config`
    calls this, then the method (docs/ARCHITECTURE.md, "Configuration").

    Runs before any weight is loaded or any function compiled. `num_devices` defaults to
    `jax.device_count()`: the run's one mesh spans every process's devices. `model_config` (a
    `ModelConfig`): check against this shape instead of reading `model.path`; then neither the
    checkpoint nor the task's data files need exist (the ahead-of-time plan of a cluster's run,
    `essa_jax.plan`).
    """
    check_schema(config)
    check_choice("model.dtype", config.model.dtype, DTYPES)
    if model_config is None:
        _check_model_path(config.model.path)
    if not isinstance(config.seed, int):
        raise ConfigError("seed", config.seed, "integers")
    if not isinstance(config.search_seed, int) or config.search_seed < -1:
        raise ConfigError("search_seed", config.search_seed, "-1 (= seed) or integers >= 0")
    check_positive("max_wall_seconds", config.max_wall_seconds, allow_zero=True)

    # Task.
    check_task_config(config.task, check_paths=model_config is None)
    check_positive("task.num_train", config.task.num_train)
    check_positive("task.num_heldout", config.task.num_heldout)
    nval = config.task.get("num_validation", 0)
    if isinstance(nval, bool) or not isinstance(nval, int) or nval < 0:
        raise ConfigError("task.num_validation", nval, "integers >= 0 (0 = no validation split)")
    check_positive("task.max_prompt_tokens", config.task.max_prompt_tokens)
    check_positive("generation.max_new_tokens", config.generation.max_new_tokens)

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
    check_positive("lora.alpha", config.lora.alpha)
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
    check_positive("sft.batch_size", config.sft.batch_size)
    mbs = config.sft.micro_batch_size
    if not isinstance(mbs, int) or isinstance(mbs, bool) or mbs < 0:
        raise ConfigError("sft.micro_batch_size", mbs, "integers >= 0 (rows per device; 0 = all)")
    if not isinstance(config.model.remat, bool):
        raise ConfigError("model.remat", config.model.remat, "True | False")
    check_quantization(config.model, model_config)
    check_trained_params(config)
    check_positive("sft.learning_rate", config.sft.learning_rate)
    for field in ("eval_every", "patience"):
        value = config.sft.get(field, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"sft.{field}", value, "integers >= 0 (0 = off)")
    if config.sft.get("eval_every", 0) and not config.task.get("num_validation", 0):
        raise ConfigError(
            "sft.eval_every",
            config.sft.eval_every,
            "0 without a validation split",
            "set task.num_validation > 0: SFT never stops on the held-out (test) set",
        )
    init_from = config.sft.get("init_from", "")
    if init_from and not os.path.isfile(os.path.join(init_from, "adapter_config.json")):
        raise ConfigError(
            "sft.init_from",
            init_from,
            "'' or a PEFT adapter folder (with adapter_config.json), e.g. an SFT run's "
            "<workdir>/adapter",
        )

    num_devices = device_count() if num_devices is None else num_devices
    shape = model_config
    if shape is None and config.mesh.model != 1:
        shape = peek_or_none(config.model.path)  # else checked after loading (ESSALoop)
    _check_mesh(config.mesh, num_devices, shape)
    ev = config.eval
    check_positive("eval.every", ev.every, allow_zero=True)
    check_positive("eval.every_seconds", ev.every_seconds, allow_zero=True)
    check_positive("eval.pass_k_samples", ev.pass_k_samples, allow_zero=True)
    if ev.pass_k_samples:
        ks = tuple(ev.pass_k)
        if not ks or any((not isinstance(k, int)) or k < 1 or k > ev.pass_k_samples for k in ks):
            raise ConfigError(
                "eval.pass_k", ks, f"non-empty tuples of ints in 1..{ev.pass_k_samples}"
            )
    check_positive("eval.batch_size", ev.batch_size)
    if isinstance(ev.samples_to_log, bool) or not isinstance(ev.samples_to_log, int):
        raise ConfigError("eval.samples_to_log", ev.samples_to_log, "integers >= 0 (0 = none)")
    check_positive("eval.samples_to_log", ev.samples_to_log, allow_zero=True)
    read_test = ev.get("read_test", True)
    if not isinstance(read_test, bool):
        raise ConfigError("eval.read_test", read_test, "True or False")
    if not read_test and not config.task.get("num_validation", 0):
        raise ConfigError(
            "eval.read_test",
            read_test,
            "True without a validation split",
            "set task.num_validation > 0: a run must be scored on some held-out split",
        )
    check_positive("checkpoint.every", config.checkpoint.every, allow_zero=True)
    check_positive("checkpoint.keep", config.checkpoint.keep)
    check_finite_fields(config)


def data_axis(config, num_devices: int) -> int:
    """Devices along the data axis of SFT's and GRPO's mesh (`train.pipeline.
    data_parallel_mesh`): num_devices / mesh.model, 1 on one device."""
    return num_devices // config.mesh.model if num_devices > 1 else 1


# Float fields that must be finite numbers (nan / inf would train or sample garbage, found only
# after the model is loaded and SFT ran): (field, lower bound, whether the bound is allowed).
# The grpo.* floats are GRPOConfig's, which checks them itself (grpo_config).
FINITE_FIELDS = (
    ("max_wall_seconds", 0.0, True),
    ("max_cpu_seconds", 0.0, True),
    ("eval.every_seconds", 0.0, True),
    ("task.eval_fraction", 0.0, False),
    ("lora.alpha", 0.0, False),
    ("sft.learning_rate", 0.0, False),
    ("sft.weight_decay", 0.0, True),
    ("sft.max_grad_norm", 0.0, False),
    ("essa.sigma_init", 0.0, False),
    ("essa.alpha", 0.0, False),
    ("essa.learning_rate", 0.0, False),
    ("checkpoint.preempt_seconds", 0.0, False),
)


def check_finite_fields(config) -> None:
    """Every float field of FINITE_FIELDS finite and above its bound; `essa.temperature` finite
    (> 0 when ESSA samples: the ESSA method's check). Raises ConfigError naming the field."""
    import math

    for field, low, inclusive in FINITE_FIELDS:
        block, _, name = field.rpartition(".")
        value = (config[block] if block else config)[name]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not (number and math.isfinite(value) and (value >= low if inclusive else value > low)):
            bound = ">=" if inclusive else ">"
            raise ConfigError(field, value, f"finite numbers {bound} {low:g}")
    t = config.essa.temperature
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
        raise ConfigError("essa.temperature", t, "finite numbers")


# Where the experiment config holds each essa_jax.rl.GRPOConfig field other than grpo.<same name>.
GRPO_CONFIG_FIELDS = {
    "advantage": "grpo.adv_scale",
    "gamma": "grpo.focal_gamma",
    "max_new_tokens": "generation.max_new_tokens",
    "remat": "model.remat",
}


def check_micro_batches(config, data: int) -> None:
    """`sft.micro_batch_size` against the rows each device holds: it counts rows per device
    (ceil(batch / data) on a mesh with `data` devices along its data axis, docs/ARCHITECTURE.md
    "Data-parallel GRPO and SFT"); raises ConfigError naming the field. A method checks its own
    micro-batches (`essa_jax.train.methods.check_rows`)."""
    from essa_jax.mesh import rows_per_device_problem

    mbs, batch = int(config.sft.micro_batch_size), int(config.sft.batch_size)
    valid = rows_per_device_problem(mbs, batch, data, "rows", f"sft.batch_size={batch}")
    if valid is not None:
        raise ConfigError("sft.micro_batch_size", mbs, valid)


def grpo_config(config, *, weighting: str | None = None):
    """The essa_jax.rl.GRPOConfig of an experiment config: every field of it, read mechanically
    from `config.grpo.<field>` or the place GRPO_CONFIG_FIELDS names (`grpo.weighting_args`, a
    dict, becomes the hashable `weighting_args` pairs). `weighting` overrides `grpo.weighting`:
    a method preset's (method "fgrpo" = "focal"). Raises GRPOConfigError (a ValueError naming the
    GRPOConfig field) on an invalid value; the method's validation turns it into a ConfigError
    naming the config field."""
    import dataclasses

    from essa_jax.rl import GRPOConfig

    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(GRPOConfig):
        block, name = GRPO_CONFIG_FIELDS.get(f.name, "grpo." + f.name).split(".")
        if name not in config[block]:
            raise KeyError(f"GRPOConfig.{f.name} has no config field {block}.{name}: add it")
        kwargs[f.name] = config[block][name]
    kwargs["weighting_args"] = tuple(sorted(dict(config.grpo.weighting_args).items()))
    if weighting is not None:
        kwargs["weighting"] = weighting
    return GRPOConfig(**kwargs)


# Fields whose value is a free dict (an extension's own parameters): the schema lock stops at them.
FREE_FIELDS = ("essa.strategy_args", "grpo.weighting_args")


def check_schema(config) -> None:
    """Every field of `config` exists in `base_config()` (ConfigError naming the first that does
    not, with the nearest valid names): a config file is held to the schema as the command line
    is (ml_collections' lock only guards overrides). The dicts of FREE_FIELDS are not walked."""
    import difflib

    def walk(node: Any, schema: Any, prefix: str) -> None:
        for key in node.keys():
            path = prefix + key
            if key not in schema:
                near = difflib.get_close_matches(key, list(schema.keys()), n=3, cutoff=0.5)
                hint = f"did you mean {' or '.join(map(repr, near))}? " if near else ""
                where = "config" + ("." + prefix[:-1] if prefix else "")
                raise ConfigError(
                    path,
                    node[key],
                    f"the fields of {where}: {', '.join(sorted(schema.keys()))}",
                    f"{where} has no field {key!r}; {hint}all fields: essa_jax/config.py "
                    "base_config",
                )
            if path in FREE_FIELDS:
                continue
            if isinstance(schema[key], ml_collections.ConfigDict) and hasattr(node[key], "keys"):
                walk(node[key], schema[key], path + ".")

    walk(config, _schema(), "")


@functools.lru_cache(maxsize=1)
def _schema() -> ml_collections.ConfigDict:
    return base_config()


def device_count() -> int:
    """Devices of all processes (`jax.device_count()`): the run's one mesh spans them."""
    import jax

    return jax.device_count()


@contextlib.contextmanager
def config_dir_on_path(path: str) -> Iterator[None]:
    """The directory of config file `path` first on sys.path while loading it, so a module beside
    it (a user's strategy, weighting, reward or method, registered on import) imports by name."""
    folder = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        if folder in sys.path:
            sys.path.remove(folder)


def load_config_file(path: str, *args: str) -> ml_collections.ConfigDict:
    """`get_config(*args)` of a config file (its directory on sys.path meanwhile:
    `config_dir_on_path`); configs build on one another with it, e.g.
    `load_config_file(os.path.join(os.path.dirname(__file__), "grpo_smollm2_arith.py"))`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "essa_jax_config_" + os.path.basename(path)[:-3], path
    )
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"no config file at {path}")
    module = importlib.util.module_from_spec(spec)
    with config_dir_on_path(path):
        spec.loader.exec_module(module)
        return module.get_config(*args)
