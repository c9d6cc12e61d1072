"""Tasks with verifiable answers: local HF `datasets` files, generated arithmetic, prompting.

    load_examples(path, format="auto"|"gsm8k"|"math"|"generic", on_malformed=...)
        -> (examples, report)
    generate_task("add_2d", num_train=..., num_eval=..., seed=...) -> (train, eval)
    load_task(config) -> Task(train, eval, prompt_format, reward, validation, ...): train never
        shares a prompt with held-out / validation (`prompt_key`; `Task.duplicates_removed`)
    split_train_eval(examples, eval_fraction, seed); init_cursor / next_batch (resumable batches)
    build_prompt(example, tokenizer, format=<one of PROMPT_FORMATS>, system_prompt=...)
    prompt_token_ids(examples, tokenizer, max_prompt_tokens=..., on_too_long=...) -> PromptBatch

A normalised example is a dict with at least `id`, `question`, `prompt` (= question) and `answer`
(str), plus `solution` when the source has one, and `prefill` / `expression` for arithmetic.
"""

from .batching import (
    Cursor,
    canonical_key,
    check_disjoint,
    disjoint_splits,
    epoch_order,
    init_cursor,
    iterate_batches,
    next_batch,
    next_batch_indices,
    prompt_key,
    remove_heldout_duplicates,
    split_train_eval,
)
from .generated import GENERATED_TASKS, generate_task, is_generated_task
from .loading import (
    FORMATS,
    LoadReport,
    MalformedRowError,
    detect_format,
    load_examples,
    normalise_rows,
    read_rows,
)
from .prompts import (
    PAPER_SYSTEM_PROMPT,
    PREFILL_FORMATS,
    PROMPT_FORMATS,
    PromptBatch,
    TruncationReport,
    build_prompt,
    build_prompts,
    chat_messages,
    encode_prompt_completion,
    encode_prompts,
    encode_text,
    prompt_token_ids,
)
from .tasks import TASK_FIELDS, Task, load_task

__all__ = [
    "FORMATS",
    "GENERATED_TASKS",
    "PAPER_SYSTEM_PROMPT",
    "PREFILL_FORMATS",
    "PROMPT_FORMATS",
    "TASK_FIELDS",
    "canonical_key",
    "check_disjoint",
    "disjoint_splits",
    "Cursor",
    "LoadReport",
    "MalformedRowError",
    "PromptBatch",
    "Task",
    "TruncationReport",
    "build_prompt",
    "build_prompts",
    "chat_messages",
    "detect_format",
    "encode_prompt_completion",
    "encode_prompts",
    "encode_text",
    "epoch_order",
    "generate_task",
    "init_cursor",
    "is_generated_task",
    "iterate_batches",
    "load_examples",
    "load_task",
    "next_batch",
    "next_batch_indices",
    "normalise_rows",
    "prompt_key",
    "prompt_token_ids",
    "read_rows",
    "remove_heldout_duplicates",
    "split_train_eval",
]
