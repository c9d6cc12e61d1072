"""Build a task (train / eval examples, prompt format, reward name) from a config.

    task = load_task({"name": "add_2d", "num_train": 2000, "num_eval": 100, "seed": 0})
    task = load_task({"train_path": "gsm8k_train.jsonl", "eval_path": "gsm8k_test.jsonl"})
    task = load_task({"train_path": "math.parquet", "eval_fraction": 0.05, "seed": 1})
    task = load_task({"train_path": "ifeval.jsonl", "eval_fraction": 0.1})  # IFEval rows
    task = load_task({"name": "instructions", "num_train": 2000, "num_eval": 200})

The config is a dict or an ml_collections ConfigDict with the fields of `TASK_FIELDS`; unknown
fields are an error naming the valid ones.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from .batching import check_disjoint, disjoint_splits, remove_heldout_duplicates, split_train_eval
from .generated import generate_task as _generate
from .generated import is_generated_task
from .loading import LoadReport, MalformedRowError, load_examples
from .prompts import PREFILL_FORMATS, PROMPT_FORMATS

log = logging.getLogger(__name__)

# field -> (default, meaning)
TASK_FIELDS: dict[str, tuple[Any, str]] = {
    "name": (None, "generated task name (add_2d, sub_2d, mul_1d, arith_mixed, word_problems, ...)"),
    "num_train": (2000, "generated: training problems"),
    "num_eval": (100, "generated: held-out problems"),
    "num_validation": (
        0,
        "validation problems carved from the training stream (tuning and early stopping only); "
        "with it, validation and train drop every problem the earlier splits pose (canonical_key)",
    ),
    "seed": (0, "generator seed / held-out split seed"),
    "level": (None, "generated: difficulty level of arith_mixed / word_problems"),
    "allow_negative": (False, "generated: allow negative results in sub_<n>d"),
    "train_path": (None, "local task file or save_to_disk folder (training set)"),
    "eval_path": (None, "local file of the held-out set; else eval_fraction of train_path"),
    "eval_fraction": (0.0, "held-out fraction of train_path when eval_path is not given"),
    "format": ("auto", "file format: auto, gsm8k, math, ifeval, generic"),
    "question_field": (None, "generic mapping: question column"),
    "answer_field": (None, "generic mapping: answer column"),
    "solution_field": (None, "generic mapping: solution column"),
    "id_field": (None, "generic mapping: id column"),
    "extra_fields": ((), "columns copied into every example"),
    "on_malformed": ("error", "malformed rows: error or skip"),
    "split": (None, "split of a saved DatasetDict for train_path"),
    "eval_split": (None, "split of a saved DatasetDict for eval_path"),
    "max_train": (None, "keep the first max_train training examples"),
    "max_eval": (None, "keep the first max_eval held-out examples"),
    "prompt_format": (
        None,
        "chat, prefill, assistant, plain, few_shot (default: prefill for arithmetic)",
    ),
    "system_prompt": (None, "explicit system message (None: the chat template's default)"),
    "instruction": ("", "text appended to every question"),
    "reward": (
        None,
        "reward name: arith (first number), math, format, ifeval_* (default: by format; "
        "ifeval_inst_strict for IFEval-format rows)",
    ),
}


@dataclasses.dataclass
class Task:
    """A ready task: examples, and how to prompt and score them."""

    name: str
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    prompt_format: str
    reward: str
    system_prompt: str | None = None
    instruction: str = ""
    reports: list[LoadReport] = dataclasses.field(default_factory=list)
    # Tuning / early-stopping split (num_validation > 0), disjoint from train and eval by
    # `canonical_key`; `overlap_removed` counts the problems dropped to make it so.
    validation: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    overlap_removed: dict[str, int] = dataclasses.field(default_factory=dict)
    # Training examples dropped because a held-out or validation example has the same prompt
    # (`prompt_key`): a file with duplicate rows must not test on prompts it trained on.
    duplicates_removed: int = 0

    def prompt_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `build_prompt` / `prompt_token_ids`."""
        return {
            "format": self.prompt_format,
            "system_prompt": self.system_prompt,
            "instruction": self.instruction,
        }


def _as_dict(config: Any) -> dict[str, Any]:
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    if isinstance(config, Mapping):
        return dict(config)
    raise TypeError(f"task config must be a dict or ConfigDict, got {type(config).__name__}")


def load_task(config: Any) -> Task:
    """A `Task` from a config (module docstring; fields and defaults in `TASK_FIELDS`)."""
    raw = _as_dict(config)
    unknown = sorted(set(raw) - set(TASK_FIELDS))
    if unknown:
        raise ValueError(f"unknown task config fields {unknown}; valid: {sorted(TASK_FIELDS)}")
    cfg = {k: raw.get(k, default) for k, (default, _) in TASK_FIELDS.items()}
    num_val = int(cfg["num_validation"] or 0)
    if num_val < 0:
        raise ValueError(f"num_validation must be >= 0, got {num_val}")
    reports: list[LoadReport] = []
    if cfg["name"] is not None and cfg["train_path"] is not None:
        raise ValueError("task config: give either name (generated task) or train_path, not both")
    if cfg["name"] is not None:
        if not is_generated_task(cfg["name"]):
            raise ValueError(f"task name {cfg['name']!r} is not a generated task")
        train, evals = _generate(
            cfg["name"],
            # The validation split comes off the front of the training stream: the held-out
            # problems (the stream's first num_eval) are the same with or without it.
            num_train=cfg["num_train"] + num_val,
            num_eval=cfg["num_eval"],
            seed=cfg["seed"],
            level=cfg["level"],
            allow_negative=cfg["allow_negative"],
        )
        name = cfg["name"]
        default_format = "prefill" if "prefill" in (train or evals or [{}])[0] else "chat"
    elif cfg["train_path"] is not None:
        load_kw = {
            k: cfg[k]
            for k in (
                "format",
                "question_field",
                "answer_field",
                "solution_field",
                "id_field",
                "on_malformed",
            )
        }
        load_kw["extra_fields"] = tuple(cfg["extra_fields"])
        train, rep = load_examples(cfg["train_path"], split=cfg["split"], **load_kw)
        reports.append(rep)
        if cfg["eval_path"] is not None:
            evals, rep = load_examples(cfg["eval_path"], split=cfg["eval_split"], **load_kw)
            reports.append(rep)
        else:
            train, evals = split_train_eval(train, cfg["eval_fraction"], cfg["seed"])
        name = str(cfg["train_path"])
        default_format = "chat"
    else:
        raise ValueError("task config needs name (a generated task) or train_path (a local file)")
    validation: list[dict[str, Any]] = []
    removed: dict[str, int] = {}
    if num_val:
        if num_val >= len(train):
            raise ValueError(
                f"num_validation={num_val} leaves no training examples of {len(train)}"
            )
        validation, train, removed = disjoint_splits(evals, train[:num_val], train[num_val:])
    if cfg["max_eval"] is not None:
        evals = evals[: cfg["max_eval"]]
    # After the held-out set is final and before train is cut to max_train: a training example
    # whose prompt a held-out (or validation) example has is dropped, and the next one takes its
    # place (none is dropped, and nothing changes, when the splits share no prompt).
    train, duplicates = remove_heldout_duplicates(train, evals + validation, cfg["max_train"])
    if duplicates:
        log.warning(
            "%s: removed %d training examples whose prompt a held-out or validation example "
            "has (identical up to whitespace and case); %d training examples remain",
            cfg["train_path"] or cfg["name"],
            duplicates,
            len(train),
        )
    if not train:
        raise MalformedRowError(
            f"task {cfg['train_path'] or cfg['name']!r}: no training example is left once the "
            f"{duplicates} whose prompt the held-out set has are removed; give task.eval_path a "
            "file of other prompts, or split the training file (task.eval_fraction)"
        )
    if num_val:
        check_disjoint({"test": evals, "validation": validation, "train": train})
    fmt = cfg["prompt_format"] or default_format
    if fmt not in PROMPT_FORMATS:
        raise ValueError(f"prompt_format {fmt!r} is not valid; valid: {PROMPT_FORMATS}")
    if cfg["reward"]:
        reward = cfg["reward"]
    elif any("instruction_id_list" in ex for ex in (train or evals)[:1]):
        reward = "ifeval_inst_strict"  # IFEval rows: the fraction of instructions followed
    else:
        reward = "arith" if fmt in PREFILL_FORMATS else "math"
    from essa_jax.rewards import REWARDS

    if reward not in REWARDS:
        raise ValueError(f"task reward {reward!r} is not valid; valid: {sorted(REWARDS)}")
    return Task(
        name=name,
        train=train,
        eval=evals,
        prompt_format=fmt,
        reward=reward,
        system_prompt=cfg["system_prompt"],
        instruction=cfg["instruction"],
        reports=reports,
        validation=validation,
        overlap_removed=removed,
        duplicates_removed=duplicates,
    )
