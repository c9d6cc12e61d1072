"""Task examples -> tokenised prompt sets, and the reward of a task (adapter over essa_jax.data).

An example is a dict with `prompt` (a string, or chat messages) and `answer` (docs/INTERFACES.md).
Chat prompts are rendered with the tokenizer's chat template; an assistant message at the end is
a prefill: the assistant turn is opened and continued with its text (e.g. "12 + 34 = "), so the
completion starts with the answer. The SFT target is the example's `completion` (a reference
solution) when present, else its `answer`; EOS is appended.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from essa_jax.models import pad_left
from essa_jax.train.rollouts import PromptSet


def render_prompt(tokenizer: Any, prompt: str | Sequence[dict[str, str]]) -> str:
    """The exact text the model continues: chat template (+ prefill) or the raw string."""
    if isinstance(prompt, str):
        return prompt
    messages = list(prompt)
    prefill = ""
    if messages and messages[-1]["role"] == "assistant":
        prefill = messages[-1]["content"]
        messages = messages[:-1]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return text + prefill


def reference_completion(example: dict[str, Any]) -> str:
    """SFT target text of an example (without EOS)."""
    for key in ("completion", "solution"):
        if example.get(key):
            return str(example[key])
    return str(example["answer"])


def encode_examples(
    tokenizer: Any,
    examples: Sequence[dict[str, Any]],
    *,
    max_prompt_tokens: int,
    pad_id: int,
    eos_id: int,
    length: int | None = None,
) -> tuple[PromptSet, int]:
    """Tokenise examples (prompts longer than `max_prompt_tokens` are dropped).

    Returns the PromptSet (left-padded to `length`, default the longest kept prompt) and the number
    of dropped examples.
    """
    prompts, ids, fields, targets = [], [], {}, []
    dropped = 0
    field_names = [k for k in examples[0] if k not in ("prompt",)] if examples else []
    for ex in examples:
        text = render_prompt(tokenizer, ex["prompt"])
        toks = tokenizer.encode(text, add_special_tokens=False)
        if len(toks) > max_prompt_tokens:
            dropped += 1
            continue
        prompts.append(text)
        ids.append(toks)
        for k in field_names:
            fields.setdefault(k, []).append(ex.get(k))
        targets.append(
            tokenizer.encode(reference_completion(ex), add_special_tokens=False) + [eos_id]
        )
    if not prompts:
        raise ValueError(
            f"every one of {len(examples)} prompts is longer than task.max_prompt_tokens="
            f"{max_prompt_tokens}; raise it"
        )
    tokens, mask = pad_left(ids, pad_id, length)
    return PromptSet(prompts, np.asarray(tokens), np.asarray(mask), fields, targets), dropped


# The ESSA paper's system prompt for math (arXiv 2507.04453, Sec. 4).
BOXED_SYSTEM = "Please reason step by step and place your final answer in \\boxed{}."
PROMPT_FORMATS = ("prefill", "plain", "boxed")


def check_task_config(task) -> None:
    """Validate `config.task` (name, path, prompt format) without reading the data."""
    from essa_jax.config import UNSET, ConfigError
    from essa_jax.data.arithmetic import is_arithmetic_task

    if task.prompt_format not in PROMPT_FORMATS:
        raise ConfigError("task.prompt_format", task.prompt_format, " | ".join(PROMPT_FORMATS))
    if is_arithmetic_task(task.name):
        return
    if not task.path or UNSET in task.path:
        raise ConfigError(
            "task.path",
            task.path,
            "an existing local dataset file or folder",
            f"task {task.name!r} is read from disk: set --config.task.path=/path/to/data "
            "(nothing is downloaded at run time); built-in generated tasks: add_<n>d, sub_<n>d, "
            "mul_<n>d, arith_mixed",
        )
    if not os.path.exists(task.path):
        raise ConfigError(
            "task.path", task.path, "an existing local dataset file or folder",
            "set --config.task.path=/path/to/data",
        )


def _format_prompt(ex: dict[str, Any], fmt: str) -> list[dict[str, str]]:
    question = ex.get("question") or ex["prompt"]
    if fmt == "prefill":
        prefill = ex.get("prefill")
        if not prefill:
            raise ValueError(f"prompt_format 'prefill' needs a 'prefill' field; example {ex.get('id')}")
        return [{"role": "user", "content": question}, {"role": "assistant", "content": prefill}]
    if fmt == "plain":
        return [{"role": "user", "content": f"{question} Answer with just the number."}]
    return [{"role": "system", "content": BOXED_SYSTEM}, {"role": "user", "content": question}]


def load_task(task, seed: int):
    """(train examples, held-out examples, reward fn) of `config.task`."""
    from essa_jax.data.arithmetic import generate_arithmetic, is_arithmetic_task
    from essa_jax.rewards import arith_reward, guard_reward, math_reward

    if is_arithmetic_task(task.name):
        train, heldout = generate_arithmetic(
            task.name, num_train=task.num_train, num_eval=task.num_heldout, seed=seed
        )
        reward = arith_reward if task.prompt_format == "prefill" else math_reward
    else:
        from essa_jax.data.batching import split_train_eval
        from essa_jax.data.loading import load_examples

        examples, _ = load_examples(task.path, on_malformed="skip")
        frac = min(task.num_heldout / len(examples), 0.5)
        train, heldout = split_train_eval(examples, frac, seed)
        train = train[: task.num_train]
        reward = math_reward
    for ex in train + heldout:
        ex["prompt"] = _format_prompt(ex, task.prompt_format)
    return train, heldout, guard_reward(reward)
