"""Built-in, seeded arithmetic tasks that need no download.

Task names:
- `add_{n}d`, `sub_{n}d`, `mul_{n}d`: two n-digit operands (n >= 1; 1-digit operands are 0..9,
  n-digit ones 10^(n-1)..10^n-1). Subtraction keeps the result non-negative unless
  `allow_negative=True`. `add_2d` with the "prefill" prompt format is the embedded default: the
  user turn is "What is A + B?" and the assistant turn starts with "A + B = " (SmolLM2-135M-Instruct
  is 24% greedy on it, with a reward spread across samples; docs SMOLLM2.md).
- `arith_mixed` (`arith_mixed_l1` .. `arith_mixed_l3`): expressions with operator precedence;
  level 1: three operands 1..9 with + and -; level 2: three or four operands 1..12 with +, -, *;
  level 3: four or five operands 1..12 with +, -, * and parentheses. Default: level 2.

Every example carries its exact answer (a Python int computed from the expression tree, never by
`eval`), the `expression` it came from and the `prefill` text "expression = ". Multiplication is
written "*" so that the expression is also valid Python.

Train and held-out sets are disjoint by construction: one seeded stream of distinct problems is
drawn, the first `num_eval` go to eval and the next `num_train` to train. Small problem spaces are
enumerated and permuted; large ones are rejection-sampled, so the eval set for a given (task, seed,
num_eval) does not change with num_train.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import numpy as np

_BINARY_RE = re.compile(r"^(add|sub|mul)_(\d+)d$")
_MIXED_RE = re.compile(r"^arith_mixed(?:_l(\d))?$")
_SYMBOL = {"add": "+", "sub": "-", "mul": "*"}
ENUMERATE_LIMIT = 200_000  # problem spaces up to this size are enumerated and permuted


def _digit_range(n: int) -> tuple[int, int]:
    if n < 1:
        raise ValueError(f"operand digits must be >= 1, got {n}")
    return (0, 9) if n == 1 else (10 ** (n - 1), 10**n - 1)


def _binary_example(task: str, op: str, a: int, b: int) -> dict[str, Any]:
    sym = _SYMBOL[op]
    value = a + b if op == "add" else a - b if op == "sub" else a * b
    expr = f"{a} {sym} {b}"
    return {
        "id": f"{task}:{a}{sym}{b}",
        "question": f"What is {expr}?",
        "answer": str(value),
        "expression": expr,
        "prefill": f"{expr} = ",
        "task": task,
    }


class _BinarySpace:
    """All (a, b) pairs of an n-digit binary task, indexable for enumeration and sampling."""

    def __init__(self, task: str, op: str, digits: int, allow_negative: bool):
        self.task, self.op = task, op
        self.lo, hi = _digit_range(digits)
        self.width = hi - self.lo + 1
        self.ordered = op == "sub" and not allow_negative
        # Non-negative subtraction uses pairs a >= b only: width*(width+1)/2 of them.
        self.size = self.width * (self.width + 1) // 2 if self.ordered else self.width**2

    def decode(self, idx: int) -> tuple[int, int]:
        if self.ordered:  # idx -> (i, j) with j <= i, row-major over the lower triangle
            i = int((np.sqrt(8 * idx + 1) - 1) // 2)
            while i * (i + 1) // 2 > idx:
                i -= 1
            while (i + 1) * (i + 2) // 2 <= idx:
                i += 1
            j = idx - i * (i + 1) // 2
            return self.lo + i, self.lo + j
        return self.lo + idx // self.width, self.lo + idx % self.width

    def example(self, idx: int) -> tuple[str, dict[str, Any]]:
        a, b = self.decode(idx)
        return f"{a},{b}", _binary_example(self.task, self.op, a, b)

    def sample(self, rng: np.random.Generator) -> tuple[str, dict[str, Any]]:
        return self.example(int(rng.integers(self.size)))


# --- mixed expressions: a tiny expression tree rendered with minimal parentheses -----------------

_PREC = {"+": 1, "-": 1, "*": 2}


def _render(node) -> tuple[str, int]:
    """(text, precedence) of a tree; parentheses only where precedence or `-` needs them."""
    if isinstance(node, int):
        return str(node), 3
    op, left, right = node
    lt, lp = _render(left)
    rt, rp = _render(right)
    p = _PREC[op]
    if lp < p:
        lt = f"({lt})"
    # a - (b + c) and a * (b * c) style: the right operand needs brackets at equal precedence
    # when the operator is not associative with it (-), and always when lower.
    if rp < p or (rp == p and op == "-"):
        rt = f"({rt})"
    return f"{lt} {op} {rt}", p


def _value(node) -> int:
    if isinstance(node, int):
        return node
    op, left, right = node
    a, b = _value(left), _value(right)
    return a + b if op == "+" else a - b if op == "-" else a * b


_MIXED_LEVELS = {
    1: {"operands": (3, 3), "high": 9, "ops": "+-", "parens": False},
    2: {"operands": (3, 4), "high": 12, "ops": "+-*", "parens": False},
    3: {"operands": (4, 5), "high": 12, "ops": "+-*", "parens": True},
}


class _MixedSpace:
    size = 10**12  # effectively unbounded: rejection sampling

    def __init__(self, task: str, level: int):
        if level not in _MIXED_LEVELS:
            raise ValueError(
                f"arith_mixed level {level} is not valid; valid: {sorted(_MIXED_LEVELS)}"
            )
        self.task, self.cfg = task, _MIXED_LEVELS[level]

    def sample(self, rng: np.random.Generator) -> tuple[str, dict[str, Any]]:
        cfg = self.cfg
        k = int(rng.integers(cfg["operands"][0], cfg["operands"][1] + 1))
        nums = [int(x) for x in rng.integers(1, cfg["high"] + 1, size=k)]
        ops = [cfg["ops"][int(i)] for i in rng.integers(len(cfg["ops"]), size=k - 1)]
        if cfg["parens"]:
            # Random binary tree: repeatedly join two neighbours (any shape, so brackets appear).
            items: list[Any] = list(nums)
            while len(items) > 1:
                j = int(rng.integers(len(items) - 1))
                items[j : j + 2] = [(ops.pop(), items[j], items[j + 1])]
            tree = items[0]
        else:
            # Flat expression, parsed with the usual precedence: multiplications bind first.
            terms: list[Any] = [nums[0]]
            add_ops: list[str] = []
            for op, x in zip(ops, nums[1:], strict=True):
                if op == "*":
                    terms[-1] = ("*", terms[-1], x)
                else:
                    add_ops.append(op)
                    terms.append(x)
            tree = terms[0]
            for op, t in zip(add_ops, terms[1:], strict=True):
                tree = (op, tree, t)
        expr, _ = _render(tree)
        value = _value(tree)
        ex = {
            "id": f"{self.task}:{expr.replace(' ', '')}",
            "question": f"What is {expr}?",
            "answer": str(value),
            "expression": expr,
            "prefill": f"{expr} = ",
            "task": self.task,
        }
        return expr, ex


def draw_unique(space, count: int, seed: int, task: str) -> list[dict[str, Any]]:
    if count > space.size:
        raise ValueError(
            f"task {task!r} has only {space.size} distinct problems; asked for {count} "
            "(num_train + num_eval)"
        )
    # The task name is part of the stream so that add_1d and mul_1d do not share their pairs.
    rng = np.random.default_rng([int(seed), zlib.crc32(task.encode())])
    if space.size <= ENUMERATE_LIMIT and hasattr(space, "example"):
        order = rng.permutation(space.size)[:count]
        return [space.example(int(i))[1] for i in order]
    seen: set[str] = set()
    out = []
    tries = 0
    while len(out) < count:
        key, ex = space.sample(rng)
        tries += 1
        if tries > 50 * count + 1000:
            raise ValueError(
                f"task {task!r}: could not draw {count} distinct problems ({len(out)} after "
                f"{tries} draws); lower num_train/num_eval or raise the difficulty level"
            )
        if key in seen:
            continue
        seen.add(key)
        out.append(ex)
    return out


def _space_for(name: str, *, allow_negative: bool = False, level: int | None = None):
    m = _BINARY_RE.match(name)
    if m:
        return _BinarySpace(name, m.group(1), int(m.group(2)), allow_negative)
    m = _MIXED_RE.match(name)
    if m:
        lvl = level if level is not None else int(m.group(1) or 2)
        return _MixedSpace(name, lvl)
    return None


def is_arithmetic_task(name: str) -> bool:
    return bool(_BINARY_RE.match(name) or _MIXED_RE.match(name))


def generate_arithmetic(
    name: str,
    *,
    num_train: int,
    num_eval: int,
    seed: int = 0,
    allow_negative: bool = False,
    level: int | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, eval) examples of an arithmetic task (module docstring), disjoint, seeded."""
    space = _space_for(name, allow_negative=allow_negative, level=level)
    if space is None:
        raise ValueError(
            f"unknown arithmetic task {name!r}; valid: add_<n>d, sub_<n>d, mul_<n>d, "
            "arith_mixed, arith_mixed_l1..l3"
        )
    if num_train < 0 or num_eval < 0:
        raise ValueError(f"num_train and num_eval must be >= 0, got {num_train}, {num_eval}")
    problems = draw_unique(space, num_train + num_eval, seed, name)
    return problems[num_eval:], problems[:num_eval]
