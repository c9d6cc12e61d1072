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

import dataclasses
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
    split: str = "",
) -> tuple[PromptSet, int]:
    """Tokenise a split (prompts over the limit are dropped); returns (PromptSet, dropped). A
    limit that drops every prompt is a ConfigError naming the prompts' lengths (`split` names
    them in it)."""
    from essa_jax.data import encode_text, prompt_token_ids

    batch = prompt_token_ids(
        examples,
        tokenizer,
        max_prompt_tokens=max_prompt_tokens,
        on_too_long="skip",
        **task.prompt_kwargs(),
    )
    if not batch.token_ids:
        from essa_jax.config import ConfigError

        lengths = batch.report.lengths
        raise ConfigError(
            "task.max_prompt_tokens",
            max_prompt_tokens,
            f"integers >= {min(lengths)} to keep any of these prompts (>= {max(lengths)} keeps "
            "every one)",
            f"every one of the {len(examples)} {f'{split} ' if split else ''}prompts is longer ("
            + (
                f"{min(lengths)} to {max(lengths)}"
                if min(lengths) < max(lengths)
                else str(max(lengths))
            )
            + " tokens), so none could run",
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


@dataclasses.dataclass
class EncodedTask:
    """A task's splits tokenised for one model: every split padded to one prompt width (every
    generation program compiles once), and the prompts each split dropped as too long."""

    train: PromptSet
    heldout: PromptSet
    validation: PromptSet | None
    dropped_train: int
    dropped_heldout: int


def encode_task(config: Any, task: Any, tokenizer: Any, model_config: Any) -> EncodedTask:
    """Tokenise `task`'s splits for `model_config` (its pad and EOS ids) and check that they fit
    it (`check_context`): run with the model's header, before its weights are read."""
    eos = tuple(model_config.eos_token_ids) or (tokenizer.eos_token_id,)
    pad = model_config.effective_pad_id
    enc = dict(max_prompt_tokens=config.task.max_prompt_tokens, pad_id=pad, eos_id=eos[0])
    train, dropped_train = encode_split(tokenizer, task.train, task, split="train", **enc)
    heldout, dropped_heldout = encode_split(tokenizer, task.eval, task, split="held-out", **enc)
    validation = None
    if task.validation:
        validation, _ = encode_split(tokenizer, task.validation, task, split="validation", **enc)
    splits = {"train": train, "held-out": heldout}
    if validation is not None:
        splits["validation"] = validation
    check_context(config, model_config, splits)
    width = max(d.tokens.shape[1] for d in splits.values())
    train, heldout = train.pad_to(width, pad), heldout.pad_to(width, pad)
    if validation is not None:
        validation = validation.pad_to(width, pad)
    return EncodedTask(train, heldout, validation, dropped_train, dropped_heldout)


def check_context(config: Any, model_config: Any, splits: dict[str, PromptSet]) -> None:
    """Every sequence the run builds within the model's context (`max_position_embeddings`):
    the longest prompt + `generation.max_new_tokens` (rollouts, evaluation), and the longest
    prompt + SFT target when SFT runs. Past it the positions are ones the model never saw (RoPE
    runs on, silently wrong); a ConfigError names the longest and the limit instead."""
    from essa_jax.config import ConfigError
    from essa_jax.data import MalformedRowError

    context = int(model_config.max_position_embeddings)
    new = int(config.generation.max_new_tokens)
    model = config.model.path
    if new >= context:
        raise ConfigError(
            "generation.max_new_tokens",
            new,
            f"integers < {context}, the context of {model} (max_position_embeddings), less the "
            "longest prompt",
        )
    name, data = max(splits.items(), key=lambda kv: kv[1].tokens.shape[1])
    longest = int(data.mask.sum(axis=1).max())
    if longest + new > context:
        raise ConfigError(
            "task.max_prompt_tokens",
            config.task.max_prompt_tokens,
            f"integers <= {context - new} for {model} (prompt + generation.max_new_tokens = "
            f"{new} within its context of {context} positions, max_position_embeddings)",
            f"the longest {name} prompt is {longest} tokens: {longest} + {new} > {context}; "
            "longer prompts are dropped and counted",
        )
    if int(config.sft.steps) == 0 or config.sft.get("init_from", ""):
        return
    train = splits["train"]
    lengths = train.mask.sum(axis=1) + np.asarray([len(t) for t in train.targets])
    i = int(np.argmax(lengths))
    if lengths[i] > context:
        ex_id = train.fields.get("id", ["?"] * len(train))[i]
        raise MalformedRowError(
            f"task {config.task.name!r}: training example {ex_id!r}'s prompt + SFT target is "
            f"{int(lengths[i])} tokens, past the context of {model} ({context} positions, "
            "max_position_embeddings); shorten its solution / answer or drop it"
        )


def load_task(task_config, seed: int):
    """(essa_jax.data Task, guarded reward fn) of `config.task`; the reward's failure limit is
    `task.max_reward_failure_fraction`."""
    from essa_jax.data import load_task as data_load_task
    from essa_jax.rewards import get_reward, guard_reward

    task = data_load_task(data_task_config(task_config, seed))
    _check_prefill(task_config, task.train + task.eval)
    _check_reward_installed(task.reward)
    limit = float(task_config.get("max_reward_failure_fraction", 0.1))
    reward = guard_reward(get_reward(task.reward), max_failure_fraction=limit)
    return task, reward


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
