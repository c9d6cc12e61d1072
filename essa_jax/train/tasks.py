"""A run's task: `config.task` -> essa_jax.data Task -> tokenised prompt sets + reward function.

Prompts are built by essa_jax.data (`build_prompt`: chat template, prefill, system prompt); this
module only maps the experiment config onto the data package's task config, tokenises, attaches
SFT targets and wraps the reward so that a failing reward can never crash a run.

SFT target (our choice): the text after the prompt that a correct answer would have. With the
"prefill" and "assistant" formats the prompt already ends with "A + B = ", so the target is the
answer; instruction-following (IFEval) examples, whose `answer` is a reference response that
follows the instructions, train on that response as it is; otherwise the example's worked
`solution` (if any) followed by the answer in \\boxed{}, else just the boxed answer. EOS is
appended.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from essa_jax.data import PREFILL_FORMATS
from essa_jax.models import pad_left
from essa_jax.train.rollouts import PromptSet

DEFAULT_SYSTEM = "default"  # config sentinel: the chat template's own system prompt


def data_task_config(task, seed: int) -> dict[str, Any]:
    """The essa_jax.data `load_task` config of `config.task`."""
    from essa_jax.data import is_generated_task

    out: dict[str, Any] = {
        "seed": seed,
        "prompt_format": task.prompt_format,
        "system_prompt": None if task.system_prompt == DEFAULT_SYSTEM else task.system_prompt,
        "instruction": task.instruction,
        "reward": task.reward or None,
        "num_validation": int(task.get("num_validation", 0)),
    }
    if is_generated_task(task.name) and not task.path:
        out.update(name=task.name, num_train=task.num_train, num_eval=task.num_heldout)
    else:
        out.update(
            train_path=task.path,
            eval_path=task.eval_path or None,
            eval_fraction=0.0 if task.eval_path else task.eval_fraction,
            max_train=task.num_train,
            max_eval=task.num_heldout,
            on_malformed=task.get("on_malformed", "error"),
        )
    return out


def reference_completion(example: dict[str, Any], prompt_format: str) -> str:
    """SFT target text of an example (module docstring), without EOS."""
    answer = str(example["answer"])
    if prompt_format in PREFILL_FORMATS or "instruction_id_list" in example:
        return answer
    solution = example.get("solution") or ""
    boxed = f"The final answer is \\boxed{{{answer}}}."
    return (
        f"{solution.strip()}\n{boxed}"
        if solution and "\\boxed" not in solution
        else (solution or boxed)
    )


def encode_split(
    tokenizer: Any,
    examples: Sequence[dict[str, Any]],
    task: Any,
    *,
    max_prompt_tokens: int,
    pad_id: int,
    eos_id: int,
) -> tuple[PromptSet, int]:
    """Tokenise a split (prompts over the limit are dropped); returns (PromptSet, dropped)."""
    from essa_jax.data import encode_text, prompt_token_ids

    batch = prompt_token_ids(
        examples,
        tokenizer,
        max_prompt_tokens=max_prompt_tokens,
        on_too_long="skip",
        **task.prompt_kwargs(),
    )
    if not batch.token_ids:
        raise ValueError(
            f"every one of {len(examples)} prompts is longer than task.max_prompt_tokens="
            f"{max_prompt_tokens}; raise it"
        )
    tokens, mask = pad_left(batch.token_ids, pad_id)
    skip = ("prompt", "messages")
    names = [k for k in batch.examples[0] if k not in skip]
    fields = {k: [ex.get(k) for ex in batch.examples] for k in names}
    targets = [
        encode_text(tokenizer, reference_completion(ex, task.prompt_format)) + [eos_id]
        for ex in batch.examples
    ]
    data = PromptSet(batch.texts, np.asarray(tokens), np.asarray(mask), fields, targets)
    return data, batch.report.count


def load_task(task_config, seed: int):
    """(essa_jax.data Task, guarded reward fn) of `config.task`."""
    from essa_jax.data import load_task as data_load_task
    from essa_jax.rewards import get_reward, guard_reward

    task = data_load_task(data_task_config(task_config, seed))
    _check_prefill(task_config, task.train + task.eval)
    _check_reward_installed(task.reward)
    return task, guard_reward(get_reward(task.reward))


def _check_reward_installed(name: str) -> None:
    """The IFEval rewards call lm-eval's checkers (the `lmeval` extra): without it every
    completion would fail to score, so a run stops before loading weights, in one line."""
    from essa_jax.rewards import IFEVAL_REWARDS

    if name not in IFEVAL_REWARDS:
        return
    from essa_jax.config import ConfigError
    from essa_jax.rewards.ifeval import reference

    try:
        reference()
    except ImportError as e:
        raise ConfigError(
            "task.reward", name, "a reward whose packages are installed", str(e)
        ) from e


def _check_prefill(task_config, examples: Sequence[dict[str, Any]]) -> None:
    """The prefilled formats start the answer with each example's `prefill` text ("A + B = "),
    which only the arithmetic generators write: a file task without it is a config error."""
    from essa_jax.config import ConfigError

    if task_config.prompt_format not in PREFILL_FORMATS:
        return
    missing = next((ex for ex in examples if not ex.get("prefill")), None)
    if missing is not None:
        raise ConfigError(
            "task.prompt_format",
            task_config.prompt_format,
            "'chat' | 'plain' | 'few_shot' for this task",
            f"example {missing.get('id', '?')!r} of task {task_config.name!r} has no 'prefill' "
            "text (only the generated arithmetic tasks write one)",
        )
