"""One entry point for every built-in generated task (no download needed).

    generate_task("add_2d", num_train=2000, num_eval=100, seed=0) -> (train, eval)

Names: add_<n>d, sub_<n>d, mul_<n>d, arith_mixed[_l1|_l2|_l3] (see `arithmetic`) and
word_problems[_l1|_l2|_l3] (see `word_problems`) and instructions[_ood][_l1|_l2] (IFEval-format
instruction following, see `instructions`; _ood: held-out types, topics and verbs). Train and
eval are disjoint and deterministic per seed; `prompt` is set to the question
(docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import re
from typing import Any

from .arithmetic import draw_unique, generate_arithmetic, is_arithmetic_task
from .instructions import generate_instructions
from .word_problems import WordProblemSpace

_WORD_RE = re.compile(r"^word_problems(?:_l(\d))?$")
_INSTRUCTIONS_RE = re.compile(r"^instructions(_ood)?(?:_l(\d))?$")
GENERATED_TASKS = (
    "add_1d",
    "add_2d",
    "add_3d",
    "sub_1d",
    "sub_2d",
    "mul_1d",
    "mul_2d",
    "arith_mixed",
    "arith_mixed_l1",
    "arith_mixed_l2",
    "arith_mixed_l3",
    "word_problems",
    "word_problems_l1",
    "word_problems_l2",
    "word_problems_l3",
    "instructions",
    "instructions_l1",
    "instructions_l2",
    "instructions_ood",
    "instructions_ood_l1",
    "instructions_ood_l2",
)


def is_generated_task(name: str) -> bool:
    """True for the names `generate_task` accepts (any digit count for add/sub/mul)."""
    return (
        is_arithmetic_task(name) or bool(_WORD_RE.match(name)) or bool(_INSTRUCTIONS_RE.match(name))
    )


def generate_task(
    name: str,
    *,
    num_train: int,
    num_eval: int,
    seed: int = 0,
    level: int | None = None,
    allow_negative: bool = False,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, eval) example lists of a generated task; disjoint and deterministic per seed."""
    if is_arithmetic_task(name):
        train, evals = generate_arithmetic(
            name,
            num_train=num_train,
            num_eval=num_eval,
            seed=seed,
            allow_negative=allow_negative,
            level=level,
        )
    elif m := _INSTRUCTIONS_RE.match(name):
        lvl = level if level is not None else (int(m.group(2)) if m.group(2) else None)
        return generate_instructions(
            name, num_train=num_train, num_eval=num_eval, seed=seed, level=lvl, ood=bool(m.group(1))
        )
    else:
        m = _WORD_RE.match(name)
        if m is None:
            raise ValueError(
                f"unknown generated task {name!r}; valid: {', '.join(GENERATED_TASKS)} "
                "(any digit count for add_/sub_/mul_<n>d)"
            )
        if num_train < 0 or num_eval < 0:
            raise ValueError(f"num_train and num_eval must be >= 0, got {num_train}, {num_eval}")
        lvl = level if level is not None else (int(m.group(1)) if m.group(1) else None)
        problems = draw_unique(WordProblemSpace(name, lvl), num_train + num_eval, seed, name)
        train, evals = problems[num_eval:], problems[:num_eval]
    for ex in train + evals:
        ex["prompt"] = ex["question"]
    return train, evals
