"""`train_and_evaluate(config, workdir)`: model + task -> SFT -> ESSA or a GRPO-family loop.

    1. validate the config (before any weight is read or any function compiled);
    2. load the model, tokenizer and task; tokenise train and held-out prompts;
    3. fresh run: LoRA SFT, held-out accuracy of the SFT adapter, checkpoint 0 (the state right
       after SFT); resumed run: restore the latest complete checkpoint instead;
    4. the method's loop, logging every step and evaluating the policy on the held-out set every
       `eval.every` steps and / or `eval.every_seconds` of loop clock (`eval_due`), checkpointing
       every `checkpoint.every` steps, stopping at the step budget, at `max_wall_seconds` of loop
       wall-clock or at `max_cpu_seconds` of the process's own CPU time in the loop;
    5. final held-out accuracy (+ pass@k), summary.json and a printed table, PNG plots, the adapter
       in PEFT format (`<workdir>/adapter`).

Several processes (`essa_jax.distributed`): every process runs this same function on the same
config and holds the same state; ESSA splits each generation's members over the processes
(`essa_jax.train.essa`); SFT and the GRPO family run data-parallel over every process's devices
(`data_parallel_mesh`; each GRPO rollout is generated and rewarded once, by one process).
Process 0 alone writes config.json, metrics.jsonl, TensorBoard events, summary.json, the plots and
the PEFT adapter; checkpoints are written and read by all (orbax is collective). A resumed run
falls back past a newest checkpoint that cannot be read (`essa_jax.checkpointing`).

The wall-clock axis (`wall_s`) counts the loop's own time only: SFT, held-out evaluation and
checkpoint writes are excluded, so methods compare at equal training cost; `cpu_s` is the same
span in this process's CPU seconds (unaffected by other processes on the host), and every
evaluation row records the host's 1-minute load average (`load1`), so a run that overlapped other
heavy work can be flagged.

Splits (`task.num_validation`, docs/STUDIES.md): without a validation split every evaluation reads
the held-out set, as before. With one, SFT's early stopping and the loop's periodic evaluations
read validation (rows with `split: "validation"`), and the held-out set is the test set, read once
per policy: the SFT start (`sft_eval`) and the final policy (a `test` row and summary.json).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from essa_jax import lora as lora_lib
from essa_jax import peers
from essa_jax.checkpointing import (
    Checkpointer,
    CheckpointFallbackWarning,
    WorkdirError,
    restore_checkpointer_with_fallback,
    shape_differences,
)
from essa_jax.config import search_seed
from essa_jax.evaluation import heldout_accuracy, heldout_pass_at_k
from essa_jax.lora.full import (
    TrainedWeights,
    full_policy,
    merge_weights,
    merged_masters,
    policy_inputs,
)
from essa_jax.models.export import save_hf_dir
from essa_jax.models.loading import RANDOM_PREFIX
from essa_jax.preemption import Preempted, PreemptionGuard
from essa_jax.train import summary as summary_lib
from essa_jax.train.export_record import stale_export, write_export_record
from essa_jax.train.methods import check_rows, get_method, validate_config
from essa_jax.train.metrics import MetricsLogger, Progress
from essa_jax.train.rollouts import PromptSet, Sampler, policy_sample_fn
from essa_jax.train.sft import train_sft
from essa_jax.workdir import (
    CONFIG_FILE,
    FIXED_AT_START,
    WorkdirLock,
    check_resume,
    config_changes,
    describe_changes,
    read_record,
    remove_partial_checkpoints,
    replace_dir,
    write_text_atomic,
)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# The loop's clock (seconds, monotonic): `wall_s`, `max_wall_seconds` and `eval.every_seconds`
# read it. A module attribute so that tests drive the loop with a fake clock.
clock = time.perf_counter
# The process's own CPU time (all its threads; not other processes'): `cpu_s`, `max_cpu_seconds`.
cpu_clock = time.process_time


def load_average() -> float:
    """The host's 1-minute load average (NaN where the OS has none): how busy the machine was."""
    try:
        return float(os.getloadavg()[0])
    except OSError:
        return float("nan")


ACCELERATORS = ("gpu", "tpu", "cuda", "rocm")


def model_dtype(name: str, platform: str | None = None) -> Any:
    """The jnp dtype of `config.model.dtype` = `name` on `platform` (default: JAX's default
    backend): "auto" is bfloat16 on a GPU / TPU and float32 on a CPU (config.py says why)."""
    if name == "auto":
        platform = platform or jax.default_backend()
        return jnp.bfloat16 if platform in ACCELERATORS else jnp.float32
    return DTYPES[name]


@dataclasses.dataclass
class Run:
    """What the loops share: model, tokenizer, tokenised task, reward, sampler, logger."""

    config: Any
    workdir: str
    model_config: Any
    params: Any
    tokenizer: Any
    train: PromptSet
    heldout: PromptSet
    reward_fn: Any
    sampler: Sampler
    lora_config: lora_lib.LoraConfig
    logger: MetricsLogger
    verbose: bool = True
    mesh: Any = None  # SFT's and GRPO's mesh (`data_parallel_mesh`); None = one device
    # Task-file rows dropped as malformed (task.on_malformed = "skip"); 0 for generated tasks.
    malformed_skipped: int = 0
    # Training examples dropped for sharing a prompt with held-out / validation (data.load_task).
    duplicates_removed: int = 0
    # The counts of what the reward could not score (train.reward_counts); built by build_run.
    reward_counter: Any = None
    # The base every program after SFT runs on (ESSA's population, GRPO, held-out evaluation):
    # `params` with the projections in `model.quantize` form; `params` itself when "none".
    infer_params: Any = None
    # The validation split (task.num_validation > 0), else None: what SFT's early stopping and the
    # periodic evaluations read; `heldout` is then the test set, read once per policy.
    validation: PromptSet | None = None

    @property
    def tuning_set(self) -> str:
        """The split periodic evaluations read: "validation" when there is one, else "test"."""
        return "validation" if self.validation is not None else "test"

    def __post_init__(self) -> None:
        if self.infer_params is None:
            self.infer_params = self.params

    def log(self, msg: str) -> None:
        if self.verbose:
            print(msg, flush=True)


def load_model(config, tokenizer: Any = None) -> tuple[Any, Any, Any]:
    """(ModelConfig, params, tokenizer) of `config.model` (`tokenizer`: one already loaded)."""
    from essa_jax.models import load_pretrained, load_tokenizer

    dtype = model_dtype(config.model.dtype)
    path = config.model.path
    if path.startswith(RANDOM_PREFIX):
        from essa_jax.models.tiny import CharTokenizer, tiny_model

        model_config, params = tiny_model(path[len(RANDOM_PREFIX) :], config.seed, dtype)
        return model_config, params, tokenizer or CharTokenizer()
    # The tokenizer first: a directory without tokenizer files fails before the weights are read.
    tokenizer = tokenizer or load_tokenizer(config.model.tokenizer or path)
    model_config, params = load_pretrained(path, dtype)
    return model_config, params, tokenizer


def load_tokenizer_and_header(config) -> tuple[Any, Any]:
    """(tokenizer, ModelConfig or None) of `config.model` without its weights: the header
    (`config.peek_or_none`) is None where the shape cannot be read without them."""
    from essa_jax.config import peek_or_none

    path = config.model.path
    if path.startswith(RANDOM_PREFIX):
        from essa_jax.models.tiny import CharTokenizer

        return CharTokenizer(), peek_or_none(path)
    from essa_jax.models import load_tokenizer

    return load_tokenizer(config.model.tokenizer or path), peek_or_none(path)


def _same_ids(a: Any, b: Any) -> bool:
    """Whether two ModelConfigs tokenise and fit prompts alike (pad, EOS, context)."""
    keys = ("effective_pad_id", "eos_token_ids", "max_position_embeddings")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def quantized_base(config, model_config: Any, params: Any) -> Any:
    """`params` with the projections in `config.model.quantize` form (`params` when "none"): a
    GGUF's Q8_0 / Q4_0 / Q4_1 blocks as they are, other kernels quantised with qwix
    (`models.quantize_base`). SFT keeps the float `params`; everything after it runs on this."""
    from essa_jax.models import quantize_base, quantize_params

    mode, group = config.model.quantize, int(config.model.quant_group)
    if mode == "none":
        return params
    from essa_jax.config import check_quantization

    # A shape validate_config could not read without the weights is checked here.
    check_quantization(config.model, model_config)
    if config.model.path.startswith(RANDOM_PREFIX):
        return quantize_params(params, mode, group)
    return quantize_base(config.model.path, params, model_config, mode, group)


def data_parallel_mesh(config) -> Any:
    """The mesh of SFT and the GRPO family: `make_mesh(pop=1, data=devices / mesh.model,
    model=mesh.model)` over every process's devices (docs/ARCHITECTURE.md, "Data-parallel GRPO
    and SFT"); None on a single device, where the one-device programs run exactly as before."""
    from essa_jax.mesh import make_mesh

    n = jax.device_count()
    if n == 1:
        return None
    model = int(config.mesh.model)
    return make_mesh(pop=1, data=n // model, model=model)


def check_data_parallel(config, mesh: Any) -> None:
    """The micro-batch sizes against the rows each device of `mesh` holds (`methods.check_rows`);
    raises ConfigError naming the field."""
    from essa_jax.mesh import DATA_AXIS, axis_size

    check_rows(config, axis_size(mesh, DATA_AXIS))


def _key_data(key: jax.Array) -> jax.Array:
    return jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key


def check_task_data(config) -> str:
    """What `build_run` checks of `config`'s task before any weight is read, without the
    weights: the data read and split, every prompt tokenised against task.max_prompt_tokens and
    the model's context (`encode_task`). Raises what the run would (ConfigError,
    MalformedRowError, ...); returns the line `--dry_run` prints. Where the model's shape cannot
    be read without its weights, the context is left to the run, and the line says so."""
    from essa_jax.train.tasks import encode_task, load_task

    task, _ = load_task(config.task, config.seed)
    tokenizer, header = load_tokenizer_and_header(config)
    if header is None:
        return (
            f"task {config.task.name}: {len(task.train)} train / {len(task.eval)} held-out "
            "examples read (prompt lengths not checked: the model's context is not known "
            "without its weights)"
        )
    enc = encode_task(config, task, tokenizer, header)
    return (
        f"task {config.task.name}: {len(enc.train)} train / {len(enc.heldout)} held-out prompts "
        f"of <= {enc.train.tokens.shape[1]} tokens fit task.max_prompt_tokens="
        f"{config.task.max_prompt_tokens} (dropped {enc.dropped_train} / {enc.dropped_heldout})"
    )


def build_run(config, workdir: str, *, verbose: bool = True) -> Run:
    """Load the model and task of `config` into a Run (no training)."""
    from essa_jax.train.reward_counts import RewardCounter
    from essa_jax.train.tasks import encode_task, load_task

    t0 = time.perf_counter()
    # The task first: a data file that cannot be read fails before any weight is read; then the
    # tokenizer and the model's header: prompts that cannot run (all longer than
    # task.max_prompt_tokens, or past the model's context) fail before the weights are read too.
    task, reward_fn = load_task(config.task, config.seed)
    tokenizer, header = load_tokenizer_and_header(config)
    encoded = encode_task(config, task, tokenizer, header) if header is not None else None
    model_config, params, tokenizer = load_model(config, tokenizer)
    if encoded is None or not _same_ids(header, model_config):
        encoded = encode_task(config, task, tokenizer, model_config)
    lora_config = lora_lib.LoraConfig(
        rank=config.lora.rank, alpha=float(config.lora.alpha), targets=tuple(config.lora.targets)
    )
    lora_config.validate_for(model_config)
    eos = tuple(model_config.eos_token_ids) or (tokenizer.eos_token_id,)
    pad = model_config.effective_pad_id
    # One prompt width for every split (encode_task): every generation program compiles once.
    train, heldout, validation = encoded.train, encoded.heldout, encoded.validation
    dropped_train, dropped_heldout = encoded.dropped_train, encoded.dropped_heldout
    sampler = Sampler(model_config, config.generation.max_new_tokens, eos, pad)
    mesh = data_parallel_mesh(config)
    if int(config.mesh.model) > 1:
        from essa_jax.config import check_mesh_model
        from essa_jax.mesh import place_params

        # The shape known only now (e.g. a GGUF) gets the same check as at validation; then the
        # weights are split over the model axis once, for every program of the run (held-out
        # evaluation included: it runs tensor-parallel from the weights' shardings).
        check_mesh_model(config.mesh, jax.device_count(), model_config)
        params = place_params(params, mesh, model_config)
    infer_params = quantized_base(config, model_config, params)
    if int(config.mesh.model) > 1 and infer_params is not params:
        from essa_jax.mesh import place_params

        infer_params = place_params(infer_params, mesh, model_config)
    run = Run(
        config=config,
        workdir=workdir,
        model_config=model_config,
        params=params,
        tokenizer=tokenizer,
        train=train,
        heldout=heldout,
        reward_fn=reward_fn,
        sampler=sampler,
        lora_config=lora_config,
        logger=MetricsLogger(workdir, write_files=_is_main()),
        verbose=verbose and _is_main(),
        mesh=mesh,
        malformed_skipped=sum(r.num_skipped for r in task.reports),
        infer_params=infer_params,
        validation=validation,
        duplicates_removed=task.duplicates_removed,
        reward_counter=RewardCounter(
            reward_fn, float(config.task.get("max_reward_failure_fraction", 0.1))
        ),
    )
    check_data_parallel(config, run.mesh)
    run.log(
        f"model {config.model.path} ({model_config.num_params() / 1e6:.1f}M params) and task "
        f"{config.task.name}: {len(train)} train / {len(heldout)} held-out prompts of "
        f"<= {train.tokens.shape[1]} / {heldout.tokens.shape[1]} tokens "
        f"(dropped {dropped_train} / {dropped_heldout} too long"
        + (f"; {run.malformed_skipped} malformed rows skipped" if run.malformed_skipped else "")
        + (
            f"; {run.duplicates_removed} training examples removed: their prompt is a held-out one"
            if run.duplicates_removed
            else ""
        )
        + f"), loaded in {time.perf_counter() - t0:.1f}s"
    )
    if validation is not None:
        removed = task.overlap_removed
        run.log(
            f"validation split: {len(validation)} prompts; removed {removed.get('validation', 0)} "
            f"validation / {removed.get('train', 0)} train problems that an earlier split poses "
            "(swapped operands included); held-out = the test set, read once per policy"
        )
    for report in task.reports:
        if report.num_skipped:
            run.log(report.summary())
    return run


def evaluate_policy(
    run: Run, lora: Any, *, step: int | None = None, evaluation: str = "", split: str = "test"
) -> dict[str, Any]:
    """Greedy held-out accuracy of the policy `lora` (None: the base model; `TrainedWeights`: a
    full-parameter run's weights) on the run's inference
    base (`Run.infer_params`: quantised when `model.quantize` is set), with its 95% CI and
    per-problem `solved` string (`essa_jax.evaluation.heldout_accuracy`). With a `step`, the
    first `eval.samples_to_log` completions go to eval_samples.jsonl, tagged with `step` and
    `evaluation` (`MetricsLogger.write_samples`). `split`: "test" (the held-out set) or
    "validation" (`Run.validation`); with a validation split the result carries `split`."""
    data = run.validation if split == "validation" else run.heldout
    if data is None:
        raise ValueError("evaluate_policy(split='validation') needs task.num_validation > 0")
    params, lora = policy_inputs(lora, run.infer_params)
    sample = policy_sample_fn(
        run.sampler,
        run.tokenizer,
        params,
        data,
        jax.random.PRNGKey(0),
        batch_size=run.config.eval.batch_size,
        lora=lora,
    )
    keep = int(run.config.eval.samples_to_log) if step is not None else 0
    ev = heldout_accuracy(sample, data.prompts, data.fields, run.reward_fn, keep_samples=keep)
    if keep:
        run.logger.write_samples(step, evaluation, ev.pop("samples"))
    if run.validation is not None:
        ev["split"] = split
    return ev


def initial_policy(run: Run, key: jax.Array, *, sft: bool = False) -> Any:
    """What SFT starts from (`sft=True`) or a loop's state is shaped like (`config.train.params`):
    a fresh LoRA, or the base's weights as float32 masters (`TrainedWeights`, full-parameter
    training, `lora.full`). SFT of a full-parameter run with `train.sft_params = "lora"` trains a
    fresh LoRA (folded into the weights after SFT: `_sft`)."""
    subset = run.config.train.params
    if subset != "lora" and not (sft and run.config.train.sft_params == "lora"):
        return TrainedWeights(full_policy(run.params, subset)[0])
    # float32 whatever the model dtype: the trained adapter is a master copy (lora.master_weights).
    return lora_lib.init_lora(key, run.model_config, run.lora_config, jnp.float32)


def _sft(run: Run, key: jax.Array) -> tuple[dict, dict[str, Any]]:
    """Train the SFT adapter (or, with `train.params`, the weights), or read it from
    `sft.init_from`; return it and its held-out (test) accuracy, and with a validation split its
    validation accuracy and the early-stopping record (`sft_validation`: step -> accuracy)."""
    c = run.config
    t0 = time.perf_counter()
    lora0 = initial_policy(run, key, sft=True)
    full = isinstance(lora0, TrainedWeights)
    curve: dict[int, float] = {}
    init_from = c.sft.get("init_from", "")
    if init_from:
        sft_lora = _read_sft_adapter(run, init_from, full)
    else:

        def log_fn(step: int, m: dict[str, float]) -> None:
            run.logger.write("sft", step, wall_s=time.perf_counter() - t0, tokens=0, **m)

        def eval_fn(step: int, lora: Any) -> float:
            ev = evaluate_policy(run, TrainedWeights(lora) if full else lora, split="validation")
            ev.pop("solved", None)
            run.logger.write("sft_eval", step, wall_s=time.perf_counter() - t0, **ev)
            run.log(f"SFT step {step}: validation accuracy {ev['acc']:.3f}")
            curve[step] = ev["acc"]
            return ev["acc"]

        sft_lora = train_sft(
            lora0.masters if full else lora0,
            run.params,
            run.model_config,
            run.train,
            c.sft,
            seed=c.seed,
            pad_id=run.sampler.pad_token_id,
            log_fn=log_fn,
            remat=bool(c.model.remat),
            mesh=run.mesh,
            to_params=merge_weights if full else None,
            eval_fn=eval_fn if c.sft.get("eval_every", 0) else None,
        )
        if full:
            sft_lora = TrainedWeights(sft_lora)
    sft_s = time.perf_counter() - t0
    ev = evaluate_policy(run, sft_lora, step=0, evaluation="sft")
    val = evaluate_policy(run, sft_lora, split="validation") if run.validation is not None else None
    if c.train.params != "lora" and not full:
        # train.sft_params = "lora": the LoRA SFT model (evaluated above as the adapter methods
        # evaluate it) becomes the full-parameter loop's start, its adapter folded into the weights.
        sft_lora = TrainedWeights(merged_masters(run.params, sft_lora, c.train.params))
    base = evaluate_policy(run, None, step=0, evaluation="base") if c.eval.base_model else None
    steps = "read from " + init_from if init_from else f"{max(curve or [c.sft.steps])} steps"
    run.log(
        f"SFT: {steps} in {sft_s:.1f}s; held-out accuracy {ev['acc']:.3f} "
        f"[{ev['ci_low']:.3f}, {ev['ci_high']:.3f}] (n={ev['n']})"
        + (f"; base model {base['acc']:.3f}" if base else "")
    )
    info = {"sft_seconds": sft_s, "sft_eval": ev, "base_eval": base}
    if val is not None:
        info["sft_validation_eval"] = val
    if curve:
        # Ties: the earlier step (train_sft's rule).
        best = max(curve, key=lambda s: (curve[s], -s))
        info["sft_validation"] = {
            "curve": sorted(curve.items()),
            "best_step": best,
            "steps_run": max(curve),
        }
        run.log(f"SFT early stopping: best validation accuracy {curve[best]:.3f} at step {best}")
    if init_from:
        info["sft_init_from"] = os.path.abspath(init_from)
    return sft_lora, info


def _read_sft_adapter(run: Run, path: str, full: bool) -> Any:
    """The PEFT adapter at `path` as this run's SFT result (`sft.init_from`); its rank, alpha and
    targets must be `lora.*`'s (ConfigError naming the difference otherwise)."""
    from essa_jax.config import ConfigError

    stale = stale_export(path)
    if stale:
        # A run resumed past its export and stopped: its adapter/ is not the run's result.
        raise ConfigError(
            "sft.init_from", path, "the latest export of a run (or a folder outside a run)", stale
        )
    try:
        lora_config, lora = lora_lib.import_peft(path, run.model_config)
    except (OSError, ValueError) as e:
        raise ConfigError("sft.init_from", path, "a readable PEFT adapter folder", str(e)) from e
    want = run.lora_config
    got = (lora_config.rank, lora_config.alpha, tuple(lora_config.targets))
    if got != (want.rank, want.alpha, tuple(want.targets)):
        raise ConfigError(
            "sft.init_from",
            path,
            f"an adapter of rank {want.rank}, alpha {want.alpha}, targets {list(want.targets)}",
            f"it has rank {got[0]}, alpha {got[1]}, targets {list(got[2])}",
        )
    if full:
        raise ConfigError(
            "sft.init_from",
            path,
            "'' for full-parameter SFT (train.sft_params = 'same')",
            "set train.sft_params = 'lora' to start full-parameter training from this adapter",
        )
    from essa_jax.lora.adapter import master_weights

    return master_weights(lora)


def train_and_evaluate(
    config,
    workdir: str,
    *,
    resume: bool | None = None,
    verbose: bool = True,
    allow_config_change: bool = False,
):
    """Run the experiment `config` in `workdir`; return the summary dict (also summary.json).

    resume: True = require a checkpoint in `workdir`; False = refuse to reuse a workdir that
    has one; None (default) = resume when a complete checkpoint exists, else start fresh.
    allow_config_change: resume even when a field that changes the run's meaning differs from the
    workdir's config.json (`essa_jax.workdir.MAY_CHANGE`; the change is recorded).

    The run holds the workdir's lock throughout (`essa_jax.workdir.WorkdirLock`) and stops on
    SIGTERM / SIGINT at a step boundary with a checkpoint (`essa_jax.preemption`: raises
    `Preempted`).
    """
    validate_config(config)
    os.makedirs(workdir, exist_ok=True)
    lock = _lock_workdir(workdir, verbose)
    guard = PreemptionGuard(config.checkpoint.preempt_seconds)
    guard.install()
    try:
        return _train_and_evaluate(config, workdir, resume, verbose, allow_config_change, guard)
    finally:
        guard.uninstall()
        if lock is not None:
            lock.release()


def _lock_workdir(workdir: str, verbose: bool) -> WorkdirLock | None:
    """Process 0 takes the workdir's lock (the other processes are the same run); every process
    raises WorkdirError when it is held by another run."""
    lock, error = (WorkdirLock(workdir), None) if _is_main() else (None, None)
    if lock is not None:
        try:
            line = lock.acquire()
            if line and verbose:
                print(line, flush=True)
        except WorkdirError as e:
            error = e
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        held = multihost_utils.process_allgather(np.asarray(error is not None, np.int32))
        if error is None and int(np.max(held)):
            if lock is not None:
                lock.release()
            error = WorkdirError(f"{workdir} is in use by another run (process 0 names it)")
    if error is not None:
        raise error
    return lock


def _train_and_evaluate(config, workdir, resume, verbose, allow_config_change, guard):
    if _is_main():
        # A killed checkpoint write leaves orbax's temporary directory: never read, removed here.
        for name in remove_partial_checkpoints(os.path.join(workdir, "checkpoints")):
            if verbose:
                print(f"removed {workdir}/checkpoints/{name}, a checkpoint write that was killed")
    ckpt = Checkpointer(workdir, keep=config.checkpoint.keep)
    latest = ckpt.latest_step()
    if resume is True and latest is None:
        raise WorkdirError(
            f"--resume: no complete checkpoint in {workdir}/checkpoints; drop --resume to start "
            "afresh"
        )
    if resume is False and latest is not None:
        raise WorkdirError(
            f"{workdir} already holds checkpoints (latest step {latest}); resume (the default) or "
            "use a new --workdir"
        )
    record = json.loads(config.to_json_best_effort())
    forced: dict = {}
    if latest is not None:
        # Refused before anything is written: config.json stays the record of the run. An
        # accepted change is recorded (config_changes.jsonl, config.json) only once the state
        # has been restored with it.
        check_resume(
            workdir, record, latest, allow_change=allow_config_change, record_changes=False
        )
        old = read_record(workdir)
        forced = config_changes(old, record)[0] if old is not None else {}
    elif _is_main():
        write_text_atomic(os.path.join(workdir, CONFIG_FILE), json.dumps(record, indent=2) + "\n")

    run = build_run(config, workdir, verbose=verbose)
    loop = get_method(config.method).make_loop(run)
    k_sft, _ = jax.random.split(jax.random.PRNGKey(config.seed))
    # The loop's key comes from search_seed (= seed unless set): same SFT, other search.
    _, k_loop = jax.random.split(jax.random.PRNGKey(search_seed(config)))

    if latest is None:
        sft_lora, info = _sft(run, k_sft)
        start = info.get("sft_validation_eval", info["sft_eval"])
        run.logger.write(
            "eval", 0, wall_s=0.0, cpu_s=0.0, tokens=0, rollouts=0, load1=load_average(), **start
        )
        meta = {**info, "wall_s": 0.0, "cpu_s": 0.0, "tokens": 0, "rollouts": 0, "history": []}
        meta["load_at_start"] = load_average()
        meta["reward_counts"] = run.reward_counter.totals()
        if loop is None:
            state = {"lora": sft_lora}
        else:
            state = loop.init_state(k_loop, sft_lora)
        meta["history"] = list(run.logger.history)
        ckpt.save(0, state, meta)
        guard.last_checkpoint = 0
        run.logger.restore(meta["history"])
    else:
        template = _template(run, loop, k_loop)
        saved = ckpt.saved_shapes(latest)
        diffs = shape_differences(template, saved) if saved is not None else []
        if diffs:
            # Decided from the step's metadata, before any restore: a restore that fails on
            # shapes would otherwise count as a broken checkpoint and be quarantined.
            what = describe_changes(forced) if forced else "the config"
            raise WorkdirError(
                f"cannot resume {workdir} at step {latest}: {what} changes the saved state's "
                f"shapes ({'; '.join(diffs[:3])}{'; ...' if len(diffs) > 3 else ''}); nothing was "
                "changed: resume with the run's own values or start a new --workdir"
            )
        # A newest step that cannot be read (truncated, half-copied) is quarantined with a
        # CheckpointFallbackWarning and the previous one resumed instead.
        # When none can be read, the one error line says why for each step (no warnings first).
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            restored = restore_checkpointer_with_fallback(ckpt, ckpt.directory, template)
        if restored is None:
            why = "; ".join(
                str(w.message).split(" in ", 1)[0]
                + ": "
                + str(w.message).split("restored (", 1)[-1]
                for w in caught
                if issubclass(w.category, CheckpointFallbackWarning)
            ).replace("; falling back to the previous complete checkpoint", "")
            raise WorkdirError(
                f"no checkpoint in {ckpt.directory} can be restored ({why}); move the directory "
                "away to start afresh"
            )
        for w in caught:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        latest, state, meta = restored
        # What the reward could not score up to that checkpoint: the run's totals go on from it
        # (checkpoint 0's are its SFT evaluation's, which a resume from it scores anew).
        run.reward_counter.base.update(meta.get("reward_counts", {}) if latest else {})
        guard.last_checkpoint = latest
        line = check_resume(
            workdir, record, latest, allow_change=allow_config_change, record_changes=_is_main()
        )
        if line and verbose and _is_main():
            print(line, flush=True)
        for field in sorted(f for f in forced if f.startswith(FIXED_AT_START)):
            # The field is read when a run starts; the restored state carries its own value.
            run.log(
                f"note: {describe_changes({field: forced[field]})} takes no effect: it is read "
                "only when a run starts, and the state restored "
                f"from step {latest} keeps the value it started with"
            )
        if _is_main():
            write_text_atomic(
                os.path.join(workdir, CONFIG_FILE), json.dumps(record, indent=2) + "\n"
            )
        ckpt.reload()
        run.log(f"resuming from {workdir}/checkpoints/{latest}")
        if latest == 0:
            meta = _rescore_baseline(run, loop, state, meta)
        run.logger.restore(meta["history"], purge_step=latest + 1)

    if run.infer_params is not run.params:
        # A quantised run reads the float weights only in SFT: from here on they would be a
        # second, larger copy of the base that nothing reads (docs/ARCHITECTURE.md, "Quantised
        # inference").
        run.params = None
    if loop is not None:
        state, meta = _run_loop(run, loop, state, meta, ckpt, guard)
        final_lora = loop.policy_lora(state)
        export = loop.export_lora(state)
    else:
        final_lora = export = state["lora"]
    # The step the export is from (the latest checkpoint, the loop's end): its readers compare it
    # with the workdir's latest checkpoint (train.export_record).
    final_step = ckpt.latest_step() or 0
    ckpt.close()

    t_eval = time.perf_counter()
    final, final_val = _final_eval(run, final_lora, meta)
    t_pass = time.perf_counter()
    read_test = final is not final_val
    pass_k = _pass_at_k(run, final_lora) if config.eval.pass_k_samples and read_test else {}
    summary = summary_lib.make_summary(config, meta, final, pass_k, validation=final_val)
    # This invocation's cost of the end (a reused last periodic evaluation costs ~0): what an
    # experiment's time plan is made from.
    summary["final_eval_seconds"] = t_pass - t_eval
    summary["pass_k_seconds"] = time.perf_counter() - t_pass
    summary["malformed_rows_skipped"] = run.malformed_skipped
    summary["heldout_duplicates_removed"] = run.duplicates_removed
    # Completions the reward could not score (raised, NaN / inf, timed out), over the whole run.
    summary.update(run.reward_counter.totals())
    if run.verbose:
        run.reward_counter.warn_totals(summary)
    if _is_main():
        # Written beside the previous export, then renamed over it: a full disk never leaves a
        # partial adapter or model where a good one was.
        if isinstance(export, TrainedWeights):
            # Full-parameter training: the trained model as a Hugging Face checkpoint.
            out = os.path.join(workdir, "model")
            save_hf_dir(
                f"{out}.tmp-{os.getpid()}",
                merge_weights(export.masters, run.params),
                run.model_config,
                config.model.path,
                config.model.tokenizer,
            )
        else:
            out = os.path.join(workdir, "adapter")
            lora_lib.export_peft(
                f"{out}.tmp-{os.getpid()}",
                export,
                run.lora_config,
                base_model_name_or_path=config.model.path,
            )
        write_export_record(f"{out}.tmp-{os.getpid()}", final_step, config.method)
        replace_dir(f"{out}.tmp-{os.getpid()}", out)
        summary_lib.write_summary(workdir, summary, verbose=run.verbose)
        title = f"{config.method} {config.task.name}"
        summary_lib.plot_run(workdir, run.logger.history, title=title)
    run.logger.close()
    return summary


def _is_main() -> bool:
    """Process 0 of a multi-process run (always True for one process): the one writing files."""
    return jax.process_index() == 0


def _final_eval(run: Run, lora: Any, meta: dict) -> tuple[dict[str, Any], dict | None]:
    """(final, validation): held-out accuracy of the final policy: the last periodic eval if it
    was at the last step, else a fresh one (logged as an eval row at that step). With a
    validation split the periodic evaluations read validation: `validation` is its evaluation at
    the last step (periodic or fresh), and the held-out (test) set is read here, once, and logged as
    a `test` row (a resumed run that already wrote it reuses it); with `eval.read_test` False
    test is not read and `final` is the validation evaluation."""
    rows = run.logger.history
    train = [r for r in rows if r["phase"] == "train"]
    step = train[-1]["step"] if train else 0
    val = None
    if run.validation is not None:
        val = _eval_at(run, lora, meta, step, "eval", "validation")
        if not run.config.eval.get("read_test", True):
            return val, val
    return _eval_at(run, lora, meta, step, "test" if val else "eval", "test"), val


def _eval_at(run: Run, lora: Any, meta: dict, step: int, phase: str, split: str) -> dict:
    """The `phase` row of `step` from the history, else a fresh evaluation of `split` logged so."""
    evals = [r for r in run.logger.history if r["phase"] == phase]
    if evals and evals[-1]["step"] == step:
        return evals[-1]
    ev = evaluate_policy(run, lora, step=step, evaluation="final", split=split)
    axes = {
        "wall_s": meta["wall_s"],
        "cpu_s": meta.get("cpu_s", 0.0),
        "tokens": meta["tokens"],
        "rollouts": meta.get("rollouts", 0),
        "load1": load_average(),
    }
    run.logger.write(phase, step, **axes, **ev)
    return ev


def _rescore_baseline(run: Run, loop, state: Any, meta: dict) -> dict:
    """Checkpoint 0's held-out scores recomputed with this run's reward: a run that failed after
    checkpoint 0 (e.g. its reward raised) must not hand a baseline scored by that reward to the
    rerun that fixed it. The SFT adapter itself does not depend on the reward and is kept."""
    c = run.config
    policy = state["lora"] if loop is None else loop.policy_lora(state)
    ev = evaluate_policy(run, policy)
    val = evaluate_policy(run, policy, split="validation") if run.validation is not None else None
    base = evaluate_policy(run, None) if c.eval.base_model else None
    history = [
        {**r, **(val or ev)} if r["phase"] == "eval" and r["step"] == 0 else r
        for r in meta["history"]
    ]
    run.log(f"checkpoint 0: SFT held-out accuracy rescored with this run's reward: {ev['acc']:.3f}")
    extra = {"sft_validation_eval": val} if val is not None else {}
    return {**meta, "sft_eval": ev, "base_eval": base, "history": history, **extra}


def _template(run: Run, loop, key: jax.Array) -> Any:
    """A state with the structure of a checkpoint (built from a zero adapter or the base's
    weights: cheap, no SFT)."""
    lora0 = initial_policy(run, key)
    if isinstance(lora0, TrainedWeights):  # the checkpoint holds float32 masters (on the host)
        lora0 = TrainedWeights(jax.tree.map(lambda x: np.asarray(x, np.float32), lora0.masters))
    if loop is None:
        return {"lora": lora0}
    return loop.init_state(key, lora0)


def _pass_at_k(run: Run, lora: Any) -> dict[str, Any]:
    """Unbiased pass@k on the first `eval.pass_k_problems` held-out problems, `eval.pass_k_samples`
    samples each at temperature 1 (`essa_jax.evaluation.heldout_pass_at_k`), each with its 95%
    percentile-bootstrap interval over the problems (seeded by `config.seed`, like the sampling
    key, so every method of one comparison resamples the same problem draws) and the per-problem
    correct counts (`pass_correct`, for paired comparisons)."""
    c = run.config.eval
    data = run.heldout.take(np.arange(min(c.pass_k_problems, len(run.heldout))))
    params, lora = policy_inputs(lora, run.infer_params)
    sample = policy_sample_fn(
        run.sampler,
        run.tokenizer,
        params,
        data,
        jax.random.PRNGKey(run.config.seed + 7),
        batch_size=c.batch_size,
        lora=lora,
    )
    return heldout_pass_at_k(
        sample,
        data.prompts,
        data.fields,
        run.reward_fn,
        samples=c.pass_k_samples,
        ks=tuple(c.pass_k),
        ci_seed=run.config.seed,
    )


def _run_loop(run: Run, loop, state, meta: dict, ckpt: Checkpointer, guard: PreemptionGuard):
    """Step until the budget (steps or wall-clock); log, evaluate, checkpoint. On a signal
    (`guard`, agreed by every process at the step boundary) checkpoint the step reached and raise
    `Preempted`."""
    c = run.config
    step = int(state.step)
    wall = float(meta["wall_s"])
    tokens = int(meta["tokens"])
    cpu = float(meta.get("cpu_s", 0.0))  # absent from checkpoints written before it was
    rollouts = int(meta.get("rollouts", 0))  # absent from checkpoints written before it was
    # The loop-clock time of the last held-out evaluation (the SFT start's is at 0): the next one
    # is due `eval.every_seconds` after it, also across a resume.
    last_eval = max([r["wall_s"] for r in run.logger.history if r["phase"] == "eval"] or [0.0])
    progress = Progress(loop.total_steps, step, desc=c.method, enabled=run.verbose)
    last_saved = step
    try:
        while step < loop.total_steps:
            signum = guard.stop_requested()
            if signum:
                if step != last_saved:
                    ckpt.save(step, state, _meta(meta, run, wall, tokens, rollouts, cpu))
                    guard.last_checkpoint = step
                raise Preempted(signum, step, os.path.join(ckpt.directory, str(step)))
            if c.max_wall_seconds and wall >= c.max_wall_seconds:
                run.log(f"stopping at step {step}: wall-clock budget {c.max_wall_seconds}s reached")
                break
            max_cpu = float(c.get("max_cpu_seconds", 0.0))
            if max_cpu and cpu >= max_cpu:
                run.log(f"stopping at step {step}: CPU-time budget {max_cpu}s reached")
                break
            run.reward_counter.step_begin()  # the step's reward calls alone (no evaluation's)
            t0, c0 = clock(), cpu_clock()
            state, m, n_tokens = loop.step(state)
            run.reward_counter.step_end()
            jax.block_until_ready(state)
            wall += clock() - t0
            cpu += cpu_clock() - c0
            tokens += n_tokens
            # Completions generated this step (the loop's count; 0 for a loop that reports none).
            rollouts += int(m.pop("rollouts", 0))
            step += 1
            axes = {"wall_s": wall, "cpu_s": cpu, "tokens": tokens, "rollouts": rollouts}
            if step % c.log_every == 0 or step == loop.total_steps:
                # With the completions the reward could not score since the previous row.
                counts = run.reward_counter.row_metrics(step)
                run.logger.write("train", step, **axes, **m, **counts)
            # Past task.max_reward_failure_fraction: one line, exit 2; the checkpoints stay.
            run.reward_counter.check()
            post = {"reward": m["reward"]}
            if eval_due(c.eval, step, wall, last_eval):
                ev = evaluate_policy(
                    run,
                    loop.policy_lora(state),
                    step=step,
                    evaluation="periodic",
                    split=run.tuning_set,
                )
                run.logger.write("eval", step, **axes, load1=load_average(), **ev)
                post["heldout"] = ev["acc"]
                last_eval = wall
            progress.update(1, **post)
            if c.checkpoint.every and step % c.checkpoint.every == 0:
                ckpt.save(step, state, _meta(meta, run, wall, tokens, rollouts, cpu))
                last_saved = guard.last_checkpoint = step
            # What a survivor's line names if a peer process disappears (essa_jax.peers).
            peers.note_progress(step, guard.last_checkpoint)
    finally:
        progress.close()
    meta = _meta(meta, run, wall, tokens, rollouts, cpu)
    if step != last_saved:
        ckpt.save(step, state, meta)
    return state, meta


def eval_due(ev: Any, step: int, wall: float, last_eval: float) -> bool:
    """Whether a held-out evaluation follows step `step` (`config.eval`): every `eval.every`
    steps, or once `eval.every_seconds` of loop clock have passed since the last one (at
    `last_eval` seconds); both may be set (one evaluation when both are due)."""
    by_step = bool(ev.every) and step % ev.every == 0
    by_time = bool(ev.every_seconds) and wall - last_eval >= ev.every_seconds
    return by_step or by_time


def _meta(meta: dict, run: Run, wall: float, tokens: int, rollouts: int, cpu: float) -> dict:
    return {
        **meta,
        "wall_s": wall,
        "cpu_s": cpu,
        "tokens": tokens,
        "rollouts": rollouts,
        "history": list(run.logger.history),
        "reward_counts": run.reward_counter.totals(),
    }


def load_summary(workdir: str) -> dict:
    with open(os.path.join(workdir, summary_lib.SUMMARY_FILE)) as f:
        return json.load(f)
