"""Evaluate a finished run (its model and trained adapter) on lm-eval benchmarks, offline.

    python -m essa_jax.evaluate_lm --run runs/essa_x --tasks ifeval --apply_chat_template
    python -m essa_jax.evaluate_lm --run runs/essa_x --ifeval_file heldout.jsonl --limit 100
    python -m essa_jax.evaluate_lm --model smollm2-135m-instruct --tasks my_task \
        --include_path my_tasks/ --output results.json

`--run` reads the run's `config.json` (model path, dtype, tokenizer, seed) and its PEFT `adapter/`
folder, which must be the run's latest (the step it records, `essa_jax_export.json`, that of the
run's latest checkpoint: a run resumed and stopped before its end has an older one;
`--allow_stale_adapter` evaluates it anyway); `--model` (optionally `--adapter`) names them
directly; `--no_adapter` scores the base model of a run. The model answers lm-eval through
`essa_jax.evaluation.lm_eval_model.EssaJaxLM`.

Nothing is downloaded: a task whose data lives on the hub needs the data locally (lm-eval's task
YAML with `dataset_path: json` and `data_files`, found through `--include_path`). `--ifeval_file`
does this for IFEval: it writes a task `ifeval_local` that includes lm-eval's own `ifeval.yaml`
(prompts, generation settings, the four metrics) over a local IFEval-format file, e.g. google/IFEval
saved as jsonl, or a generated task's held-out rows. For IFEval tasks the output also holds
per-instruction-type strict / loose accuracy. A user's mistake ends in one line on stderr and exit
status 2 (docs/IFEVAL.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any


class EvalUsageError(Exception):
    """A mistake in the command line or in the files it names."""


def ifeval_task_dir(data_file: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write `ifeval_local.yaml` (lm-eval's `ifeval` task over a local IFEval-format file) into
    `out_dir`; returns `out_dir` (an lm-eval `include_path`)."""
    from lm_eval.tasks.ifeval import utils as ifeval_utils  # a namespace package: no __file__

    data = Path(data_file).resolve()
    if not data.is_file():
        raise EvalUsageError(f"--ifeval_file {data_file}: no such file")
    base = Path(ifeval_utils.__file__).parent / "ifeval.yaml"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ifeval_local.yaml").write_text(
        f"include: {json.dumps(str(base))}\n"
        "task: ifeval_local\n"
        "dataset_path: json\n"
        "dataset_name: null\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    train: {json.dumps(str(data))}\n"
        "test_split: train\n"
    )
    return out


def per_instruction_accuracy(samples: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """{instruction id: {"strict", "loose", "n"}} over the logged samples of an IFEval task."""
    hits: dict[str, list[list[bool]]] = defaultdict(lambda: [[], []])
    for s in samples:
        ids = s["doc"]["instruction_id_list"]
        for mode, key in enumerate(("inst_level_strict_acc", "inst_level_loose_acc")):
            for iid, ok in zip(ids, s[key], strict=True):
                hits[iid][mode].append(bool(ok))
    return {
        iid: {"strict": sum(st) / len(st), "loose": sum(lo) / len(lo), "n": len(st)}
        for iid, (st, lo) in sorted(hits.items())
    }


def _load(args: argparse.Namespace) -> tuple[Any, Any, Any, Any, str]:
    """(model_config, params, tokenizer, lora or None, description) of the command line."""
    import ml_collections

    from essa_jax.lora import import_peft
    from essa_jax.train.pipeline import load_model

    if args.run:
        adapter = check_run_folder(args)
        config = ml_collections.ConfigDict(json.loads((Path(args.run) / "config.json").read_text()))
    else:
        config = ml_collections.ConfigDict(
            {"seed": 0, "model": {"path": args.model, "dtype": "auto", "tokenizer": ""}}
        )
        adapter = args.adapter
    if args.dtype:
        config.model.dtype = args.dtype
    model_config, params, tokenizer = load_model(config)
    lora = None
    if adapter:
        if not (Path(adapter) / "adapter_config.json").is_file():
            raise EvalUsageError(
                f"adapter {adapter}: no adapter_config.json (a run writes adapter/ when it ends; "
                "--no_adapter evaluates its base model)"
            )
        _, lora = import_peft(adapter, model_config)
    what = f"{config.model.path}" + (f" + adapter {adapter}" if adapter else "")
    return model_config, params, tokenizer, lora, what


def check_run_folder(args: argparse.Namespace) -> str | None:
    """The adapter folder `--run` evaluates (None with --no_adapter), after the checks that need
    no model and no task data: the run's config.json exists, its adapter is its latest
    (`check_adapter_is_latest`). EvalUsageError otherwise."""
    if not (Path(args.run) / "config.json").is_file():
        raise EvalUsageError(f"--run {args.run}: no config.json (not a run's workdir)")
    adapter = None if args.no_adapter else (args.adapter or str(Path(args.run) / "adapter"))
    check_adapter_is_latest(args, adapter)
    return adapter


def check_adapter_is_latest(args: argparse.Namespace, adapter: str | None) -> None:
    """EvalUsageError when `adapter` is a run's export older than the run's latest checkpoint (a
    finished run resumed for more steps and stopped before its new end: adapter/ and
    summary.json are from the earlier end; `train.export_record.stale_export`), unless
    `--allow_stale_adapter`. Checked before the model is loaded."""
    if adapter is None or args.allow_stale_adapter or not Path(adapter).is_dir():
        return
    from essa_jax.train.export_record import stale_export

    # The run's own checkpoints judge its adapter, also one given with --adapter inside it.
    inside = Path(adapter).resolve().parent == Path(args.run).resolve()
    stale = stale_export(adapter, args.run if inside else None)
    if stale:
        raise EvalUsageError(f"{stale}; or --allow_stale_adapter to evaluate this one anyway")


# Errors of `datasets` / `huggingface_hub` that mean "this data is not here and would have to be
# downloaded" (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE are set: nothing is).
_OFFLINE_ERRORS = (
    "OfflineModeIsEnabled",
    "LocalEntryNotFoundError",
    "DatasetNotFoundError",
    "ConnectionError",
    "on the Hub",
)


def _offline_data_error(tasks: list[str], e: BaseException) -> EvalUsageError | None:
    """The one-line EvalUsageError for `e`, raised while lm-eval loaded `tasks`, when it says the
    data is not available offline; None for any other error (a bug keeps its traceback)."""
    import re

    chain, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    text = " ".join(f"{type(x).__name__}: {x}" for x in chain)
    if not any(m in text for m in _OFFLINE_ERRORS):
        return None
    found = re.search(r"reach '([^']+)'|[Dd]ataset '([^']+)'", text)
    data = f" ({next(g for g in found.groups() if g)})" if found else ""
    hint = (
        "--ifeval_file FILE runs IFEval on a local IFEval-format jsonl (e.g. google/IFEval saved "
        "as jsonl, or a generated task's held-out rows)"
        if any(t.startswith("ifeval") for t in tasks)
        else "give the task's data locally: a task YAML with dataset_path: json and data_files, "
        "found through --include_path DIR"
    )
    return EvalUsageError(
        f"the data of task(s) {','.join(tasks)}{data} is not available offline (not in the "
        f"Hugging Face cache, and nothing is downloaded); {hint}"
    )


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Run lm-eval on the command line's model; returns the JSON written to --output."""
    try:
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager

        from essa_jax.evaluation.lm_eval_model import EssaJaxLM
        from essa_jax.rewards.ifeval import reference
    except ImportError as e:
        raise EvalUsageError(
            f"lm-eval is not installed ({e}): pip install 'essa_jax[lmeval]'"
        ) from e
    reference()  # NLTK's Punkt model in place before lm-eval's ifeval task imports (no download)
    tasks = [t for t in (args.tasks or "").split(",") if t]
    include = [p for p in (args.include_path or "").split(",") if p]
    tmp = None
    if args.ifeval_file:
        tmp = tempfile.TemporaryDirectory(prefix="essa_ifeval_")
        include.append(str(ifeval_task_dir(args.ifeval_file, tmp.name)))
        tasks.append("ifeval_local")
    if not tasks:
        raise EvalUsageError("no task: give --tasks name[,name] and / or --ifeval_file FILE")
    if args.run:
        check_run_folder(args)  # before the tasks' data is read
    manager = TaskManager(include_path=include or None)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise EvalUsageError(
            f"unknown lm-eval task(s) {unknown}; a task of your own needs --include_path DIR "
            "(its YAML), IFEval on a local file --ifeval_file FILE"
        )
    try:
        # The tasks' data before the model: a benchmark whose data is on the hub (not cached)
        # fails here, offline, in one line instead of a traceback after the model loaded.
        loaded = manager.load(tasks)
    except Exception as e:  # datasets / huggingface_hub raise their own classes
        offline = _offline_data_error(tasks, e)
        if offline is None:
            raise
        raise offline from e
    # Loaded once: the Task objects go to simple_evaluate (groups by name, to keep their scores).
    task_arg = tasks if loaded.get("groups") else list(loaded["tasks"].values())
    model_config, params, tokenizer, lora, what = _load(args)
    lm = EssaJaxLM(
        model_config,
        params,
        tokenizer,
        lora=lora,
        batch_size=args.batch_size,
        max_gen_toks=args.max_gen_toks or 256,
        seed=args.seed,
        name=what,
    )
    gen_kwargs = f"max_gen_toks={args.max_gen_toks}" if args.max_gen_toks else None
    out = simple_evaluate(
        model=lm,
        tasks=task_arg,
        task_manager=manager,
        limit=args.limit,
        apply_chat_template=args.apply_chat_template,
        gen_kwargs=gen_kwargs,
        log_samples=True,
        random_seed=args.seed,
        numpy_random_seed=args.seed,
        torch_random_seed=args.seed,
        fewshot_random_seed=args.seed,
    )
    if tmp is not None:
        tmp.cleanup()
    result: dict[str, Any] = {"model": what, "tasks": tasks, "results": out["results"]}
    for task, samples in out.get("samples", {}).items():
        if samples and "inst_level_strict_acc" in samples[0]:
            result.setdefault("per_instruction", {})[task] = per_instruction_accuracy(samples)
    if args.samples:
        result["samples"] = {
            t: [{"doc_id": s["doc_id"], "response": s["resps"][0][0]} for s in ss]
            for t, ss in out.get("samples", {}).items()
        }
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m essa_jax.evaluate_lm", description=__doc__.split("\n")[0]
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", help="a finished run's workdir (config.json + adapter/)")
    src.add_argument("--model", help="model path / name (as config.model.path)")
    p.add_argument("--adapter", help="PEFT adapter folder (default with --run: <run>/adapter)")
    p.add_argument("--no_adapter", action="store_true", help="evaluate the run's base model")
    p.add_argument(
        "--allow_stale_adapter",
        action="store_true",
        help="evaluate the run's adapter/ even when the run has a newer checkpoint (it was "
        "resumed and stopped before its end)",
    )
    p.add_argument("--dtype", default="", help="float32 | bfloat16 | auto (default: the run's)")
    p.add_argument("--tasks", default="", help="lm-eval task names, comma-separated")
    p.add_argument("--include_path", default="", help="folders of task YAMLs, comma-separated")
    p.add_argument("--ifeval_file", help="IFEval-format jsonl: adds the task ifeval_local")
    p.add_argument("--limit", type=int, default=None, help="first N documents of each task")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--max_gen_toks", type=int, default=0, help="override the tasks' (0: keep)")
    p.add_argument("--apply_chat_template", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", action="store_true", help="keep every response in the output")
    p.add_argument("--output", help="write the results JSON here (default: print)")
    args = p.parse_args(argv)
    if args.batch_size < 1:
        p.error(f"--batch_size must be >= 1, got {args.batch_size}")
    if args.no_adapter and not args.run:
        p.error("--no_adapter goes with --run")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from essa_jax.models import CheckpointError, UnsupportedModelError

    try:
        result = evaluate(args)
    except (EvalUsageError, CheckpointError, UnsupportedModelError, FileNotFoundError) as e:
        print(f"essa_jax.evaluate_lm: {e}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2) + "\n"
    if args.output:
        from essa_jax.workdir import write_text_atomic

        write_text_atomic(args.output, text)  # a crash never leaves half a results file
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
