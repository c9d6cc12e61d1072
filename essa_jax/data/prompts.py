"""Prompt strings and prompt token ids for task examples.

Formats:
- "chat": the tokenizer's chat template over [system?] + user(question + instruction), with the
  generation prompt (the assistant header) at the end.
- "prefill": "chat", then the example's `prefill` text (e.g. "23 + 45 = ") appended after the
  assistant header, so the completion starts with the answer. The embedded default for the
  arithmetic tasks (docs SMOLLM2.md: 24% greedy on add_2d for SmolLM2-135M-Instruct vs 15% without).
- "assistant": only the chat template's assistant header, then the example's `prefill` (no system
  or user turn): "<|im_start|>assistant\n23 + 45 = " for SmolLM2, 12 tokens for add_2d instead of
  32 (empty system turn) or 48 (template default). Every ESSA candidate pays for every prompt token,
  so this is the cheapest format an instruct model still answers (docs SMOLLM2.md: 23% greedy on
  add_2d before SFT, against 17% for "prefill" with an empty system turn).
- "plain" (base models): "Question: {question}{instruction}\\nAnswer:" (+ " " + prefill when the
  example has one).
- "few_shot": `shots` rendered in the "plain" layout with their answers, a blank line between, then
  the example in the "plain" layout.

System prompt: `system_prompt=None` adds no system message, so the template decides (SmolLM2's
inserts "You are a helpful AI assistant named SmolLM..." when there is none); a string adds it
explicitly, e.g. `PAPER_SYSTEM_PROMPT` (ESSA, arXiv 2507.04453). Examples that carry chat
`messages` (generic files) use them as they are (plus the system prompt if they have none).

Token ids: `encode_prompts` / `prompt_token_ids` return one list of ids per prompt (no padding:
`essa_jax.models.pad_left` does that). A prompt over `max_prompt_tokens` is never cut silently:
`on_too_long="error"` raises naming the examples, "skip" drops them, "truncate_left" drops tokens
from the *start* (system prompt / shots) so that the question's end, the assistant header and the
prefill are kept; the `TruncationReport` says how many and which (and a warning line, unless
"skip" dropped every prompt: the caller, left with nothing to run, says so in its own one line).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

PROMPT_FORMATS = ("chat", "prefill", "assistant", "plain", "few_shot")
# Formats whose prompt ends with the example's `prefill`, so the completion is the bare answer.
PREFILL_FORMATS = ("prefill", "assistant")
ON_TOO_LONG = ("error", "skip", "truncate_left")
PAPER_SYSTEM_PROMPT = "Please reason step by step and place your final answer in \\boxed{}."


def _user_text(example: Mapping[str, Any], instruction: str) -> str:
    q = example.get("question", example.get("prompt"))
    if not isinstance(q, str) or not q.strip():
        raise ValueError(
            f"example {example.get('id', '?')!r} has no non-empty string 'question' (or 'prompt')"
        )
    return q + instruction


def chat_messages(
    example: Mapping[str, Any], *, system_prompt: str | None = None, instruction: str = ""
) -> list[dict[str, str]]:
    """The chat messages of an example: [system?] + user (or the example's own `messages`)."""
    if example.get("messages"):
        msgs = [dict(m) for m in example["messages"]]
        if system_prompt is not None and msgs[0]["role"] != "system":
            msgs.insert(0, {"role": "system", "content": system_prompt})
        if instruction:
            msgs[-1]["content"] += instruction
        return msgs
    msgs = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
    msgs.append({"role": "user", "content": _user_text(example, instruction)})
    return msgs


def _plain(example: Mapping[str, Any], instruction: str, answer: str | None = None) -> str:
    text = f"Question: {_user_text(example, instruction)}\nAnswer:"
    prefill = example.get("prefill")
    if prefill:
        text += " " + prefill
    if answer is not None:
        text += answer if prefill else " " + answer
    return text


def assistant_header(tokenizer: Any) -> str:
    """The text a chat template appends for `add_generation_prompt=True` (the assistant header).

    Found as the difference between a one-message conversation rendered with and without the
    generation prompt, so it works for any template (ChatML, Llama 3, Qwen2) without knowing it.
    """
    msgs = [{"role": "user", "content": "x"}]
    without = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    with_header = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    if not with_header.startswith(without) or with_header == without:
        raise ValueError(
            "prompt format 'assistant' needs a chat template that appends an assistant header "
            "for add_generation_prompt=True; this tokenizer's does not (use 'prefill')"
        )
    return with_header[len(without) :]


def _require_prefill(example: Mapping[str, Any], format: str) -> str:
    prefill = example.get("prefill")
    if not prefill:
        raise ValueError(
            f"prompt format {format!r} needs a 'prefill' field; example "
            f"{example.get('id', '?')!r} has none (use format='chat' for this task)"
        )
    return prefill


def _shot_answer(shot: Mapping[str, Any]) -> str:
    if shot.get("solution") and not shot.get("prefill"):
        return f"{shot['solution']}\nThe answer is {shot['answer']}."
    return str(shot["answer"])


def build_prompt(
    example: Mapping[str, Any],
    tokenizer: Any = None,
    *,
    format: str = "chat",
    system_prompt: str | None = None,
    instruction: str = "",
    shots: Sequence[Mapping[str, Any]] = (),
) -> str:
    """The prompt string of one example (module docstring for the formats).

    Args:
      example: a normalised example (`question`, optional `prefill`, `messages`).
      tokenizer: anything with HF's `apply_chat_template(messages, tokenize=False,
        add_generation_prompt=True)`; needed for "chat" and "prefill".
      format: one of PROMPT_FORMATS.
      system_prompt: None (template default) or an explicit system message.
      instruction: text appended to the question, e.g. " Answer with just the number."
      shots: worked examples for "few_shot".
    """
    if format not in PROMPT_FORMATS:
        raise ValueError(f"prompt format {format!r} is not valid; valid: {PROMPT_FORMATS}")
    if format in ("chat", "prefill", "assistant"):
        if tokenizer is None or not hasattr(tokenizer, "apply_chat_template"):
            raise ValueError(f"prompt format {format!r} needs a tokenizer with apply_chat_template")
        if format == "assistant":
            return assistant_header(tokenizer) + _require_prefill(example, format)
        msgs = chat_messages(example, system_prompt=system_prompt, instruction=instruction)
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        if format == "prefill":
            text += _require_prefill(example, format)
        return text
    if format == "plain":
        return _plain(example, instruction)
    if not shots:
        raise ValueError("prompt format 'few_shot' needs at least one example in shots=")
    parts = [_plain(s, instruction, _shot_answer(s)) for s in shots]
    return "\n\n".join([*parts, _plain(example, instruction)])


def build_prompts(
    examples: Sequence[Mapping[str, Any]], tokenizer: Any = None, **kwargs: Any
) -> list[str]:
    """`build_prompt` over a list of examples (same keyword arguments)."""
    return [build_prompt(ex, tokenizer, **kwargs) for ex in examples]


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` without adding special tokens (the chat template already has them)."""
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:
        ids = tokenizer.encode(text)
    if hasattr(ids, "ids"):  # a `tokenizers.Encoding`
        ids = ids.ids
    return [int(i) for i in ids]


@dataclasses.dataclass
class TruncationReport:
    """Prompts over the token limit: how many, which (ids and lengths), and what was done."""

    limit: int | None
    action: str
    ids: list[str] = dataclasses.field(default_factory=list)
    lengths: list[int] = dataclasses.field(default_factory=list)
    kept_indices: list[int] = dataclasses.field(default_factory=list)
    max_length: int = 0

    @property
    def count(self) -> int:
        return len(self.ids)

    def summary(self) -> str:
        if not self.ids:
            return f"all prompts fit in {self.limit} tokens (longest {self.max_length})"
        shown = ", ".join(f"{i} ({n})" for i, n in zip(self.ids[:5], self.lengths, strict=False))
        more = f" and {self.count - 5} more" if self.count > 5 else ""
        return f"{self.count} prompts exceed {self.limit} tokens ({self.action}): {shown}{more}"


def encode_prompts(
    prompts: Sequence[str],
    tokenizer: Any,
    *,
    max_tokens: int | None = None,
    on_too_long: str = "error",
    ids: Sequence[str] | None = None,
) -> tuple[list[list[int]], TruncationReport]:
    """Token id lists of prompt strings under a length limit (module docstring).

    Returns (token id lists of the kept prompts, report); `report.kept_indices` maps them back.
    """
    if on_too_long not in ON_TOO_LONG:
        raise ValueError(f"on_too_long={on_too_long!r} is not valid; valid: {ON_TOO_LONG}")
    if max_tokens is not None and max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive or None, got {max_tokens}")
    names = [str(i) for i in ids] if ids is not None else [str(i) for i in range(len(prompts))]
    report = TruncationReport(limit=max_tokens, action=on_too_long)
    out = []
    for k, text in enumerate(prompts):
        toks = encode_text(tokenizer, text)
        report.max_length = max(report.max_length, len(toks))
        if max_tokens is not None and len(toks) > max_tokens:
            report.ids.append(names[k])
            report.lengths.append(len(toks))
            if on_too_long == "skip":
                continue
            if on_too_long == "truncate_left":
                toks = toks[len(toks) - max_tokens :]
        out.append(toks)
        report.kept_indices.append(k)
    if report.ids:
        if on_too_long == "error":
            raise ValueError(
                report.summary() + "; raise max_prompt_tokens, shorten the prompt, or set "
                "on_too_long='skip' or 'truncate_left'"
            )
        if out:  # every prompt dropped: the caller has nothing to run and says so in one line
            log.warning(report.summary())
    return out, report


@dataclasses.dataclass
class PromptBatch:
    """Prompts of a list of examples: strings, token ids, the kept examples, the report."""

    texts: list[str]
    token_ids: list[list[int]]
    examples: list[Mapping[str, Any]]
    report: TruncationReport


def prompt_token_ids(
    examples: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    *,
    max_prompt_tokens: int | None = None,
    on_too_long: str = "error",
    **prompt_kwargs: Any,
) -> PromptBatch:
    """Build and tokenise the prompts of `examples` (`build_prompt` keyword arguments apply).

    With `on_too_long="skip"` the returned `examples` / `texts` hold only the kept examples, in
    order, aligned with `token_ids`.
    """
    texts = build_prompts(examples, tokenizer, **prompt_kwargs)
    ids = [str(ex.get("id", k)) for k, ex in enumerate(examples)]
    token_ids, report = encode_prompts(
        texts, tokenizer, max_tokens=max_prompt_tokens, on_too_long=on_too_long, ids=ids
    )
    kept = report.kept_indices
    return PromptBatch(
        texts=[texts[k] for k in kept],
        token_ids=token_ids,
        examples=[examples[k] for k in kept],
        report=report,
    )


def encode_prompt_completion(
    prompt: str, completion: str, tokenizer: Any, *, max_tokens: int | None = None
) -> tuple[list[int], list[int]]:
    """(token ids, completion mask) of prompt + completion for supervised fine-tuning.

    Over the limit, tokens are dropped from the start of the prompt only; the completion (the
    answer part) is never cut: if it alone does not fit, a ValueError says so.
    """
    p = encode_text(tokenizer, prompt)
    c = encode_text(tokenizer, completion)
    if max_tokens is not None and len(c) > max_tokens:
        raise ValueError(
            f"completion of {len(c)} tokens does not fit in max_tokens={max_tokens}; the answer "
            "part is never truncated"
        )
    if max_tokens is not None and len(p) + len(c) > max_tokens:
        p = p[len(p) + len(c) - max_tokens :]
    return p + c, [0] * len(p) + [1] * len(c)
