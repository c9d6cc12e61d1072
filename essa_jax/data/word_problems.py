"""Seeded multi-step school-math word problems with exact answers (`word_problems[_l1|_l2|_l3]`).

Each template draws its quantities so that the answer is exact (computed with `Fraction`; the
quantities are chosen so it is a whole number except in "average_speed", whose answer may be a
fraction written "p/q"). Level 1 problems take one step, level 2 two and level 3 three.
Each example stores its `template`, `level` and the drawn `quantities`, so the answer can be
recomputed independently.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np

NAMES = (
    "Ava",
    "Ben",
    "Chloe",
    "Dev",
    "Emma",
    "Farid",
    "Grace",
    "Hugo",
    "Iris",
    "Jonas",
    "Kira",
    "Liam",
    "Maya",
    "Noah",
    "Olga",
    "Priya",
    "Quinn",
    "Ravi",
    "Sofia",
    "Tom",
)
ITEMS = ("apples", "stickers", "marbles", "pencils", "cards", "shells", "coins", "books")


def _int(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(rng.integers(lo, hi + 1))


def _pick(rng: np.random.Generator, seq):
    return seq[int(rng.integers(len(seq)))]


Template = Callable[[np.random.Generator], tuple[str, dict[str, int], Fraction]]


def _buy_more(rng):
    name, item = _pick(rng, NAMES), _pick(rng, ITEMS)
    q = {"a": _int(rng, 5, 90), "b": _int(rng, 2, 60)}
    text = (
        f"{name} has {q['a']} {item} and gets {q['b']} more. How many {item} does {name} have now?"
    )
    return text, q, Fraction(q["a"] + q["b"])


def _give_away(rng):
    name, item = _pick(rng, NAMES), _pick(rng, ITEMS)
    b = _int(rng, 2, 40)
    q = {"a": b + _int(rng, 1, 60), "b": b}
    text = f"{name} had {q['a']} {item} and gave {q['b']} to a friend. How many {item} are left?"
    return text, q, Fraction(q["a"] - q["b"])


def _boxes(rng):
    item = _pick(rng, ITEMS)
    q = {"a": _int(rng, 3, 24), "b": _int(rng, 2, 15)}
    text = f"A box holds {q['a']} {item}. How many {item} are in {q['b']} boxes?"
    return text, q, Fraction(q["a"] * q["b"])


def _share(rng):
    item = _pick(rng, ITEMS)
    b, k = _int(rng, 2, 12), _int(rng, 2, 15)
    q = {"a": b * k, "b": b}
    text = (
        f"{q['a']} {item} are shared equally among {q['b']} children. "
        f"How many {item} does each child get?"
    )
    return text, q, Fraction(q["a"], q["b"])


def _change(rng):
    name = _pick(rng, NAMES)
    a, p = _int(rng, 2, 9), _int(rng, 2, 12)
    m = _pick(rng, (50, 100, 200))
    while a * p >= m:
        a -= 1
    q = {"a": a, "p": p, "m": m}
    text = (
        f"{name} buys {a} notebooks at ${p} each and pays with a ${m} bill. "
        f"How many dollars of change does {name} get?"
    )
    return text, q, Fraction(m - a * p)


def _savings(rng):
    name = _pick(rng, NAMES)
    a, w = _int(rng, 3, 25), _int(rng, 2, 12)
    q = {"a": a, "w": w, "s": _int(rng, 1, a * w - 1)}
    text = (
        f"{name} saves ${a} each week for {w} weeks and then spends ${q['s']}. "
        "How many dollars are left?"
    )
    return text, q, Fraction(a * w - q["s"])


def _fraction_of(rng):
    den = _pick(rng, (2, 3, 4, 5, 6))
    num = _int(rng, 1, den - 1)
    n = den * _int(rng, 3, 10)
    q = {"n": n, "num": num, "den": den}
    text = (
        f"A class has {n} students. {num}/{den} of them walk to school. "
        "How many students do not walk to school?"
    )
    return text, q, Fraction(n) - Fraction(n * num, den)


def _garden(rng):
    name = _pick(rng, NAMES)
    r, c, t = _int(rng, 2, 9), _int(rng, 2, 9), _int(rng, 2, 6)
    q = {"r": r, "c": c, "t": t, "s": _int(rng, 1, r * c * t - 1)}
    text = (
        f"A garden has {r} rows of {c} tomato plants. Each plant gives {t} tomatoes. "
        f"{name} sells {q['s']} tomatoes. How many tomatoes are left?"
    )
    return text, q, Fraction(r * c * t - q["s"])


def _discount(rng):
    name = _pick(rng, NAMES)
    p = 20 * _int(rng, 2, 15)
    d = 5 * _int(rng, 1, 12)
    sale = Fraction(p * (100 - d), 100)
    c = _int(rng, 1, max(1, int(sale) - 1))
    q = {"p": p, "d": d, "c": c}
    text = (
        f"A jacket costs ${p}. It is on sale for {d}% off, and {name} also uses a ${c} coupon. "
        f"How many dollars does {name} pay?"
    )
    return text, q, sale - c


def _average_speed(rng):
    v1, h1, v2, h2 = _int(rng, 30, 90), _int(rng, 1, 4), _int(rng, 30, 90), _int(rng, 1, 4)
    q = {"v1": v1, "h1": h1, "v2": v2, "h2": h2}
    text = (
        f"A car travels at {v1} km per hour for {h1} hours, then at {v2} km per hour for "
        f"{h2} hours. What is its average speed in km per hour for the whole trip?"
    )
    return text, q, Fraction(v1 * h1 + v2 * h2, h1 + h2)


TEMPLATES: dict[int, dict[str, Template]] = {
    1: {"buy_more": _buy_more, "give_away": _give_away, "boxes": _boxes, "share": _share},
    2: {"change": _change, "savings": _savings, "fraction_of": _fraction_of},
    3: {"garden": _garden, "discount": _discount, "average_speed": _average_speed},
}


def format_fraction(x: Fraction) -> str:
    """ "12" for whole numbers, "p/q" otherwise (a form `answers_match` compares exactly)."""
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


class WordProblemSpace:
    """Rejection-sampled space of word problems of one level (or all levels when None)."""

    size = 10**12

    def __init__(self, task: str, level: int | None):
        if level is not None and level not in TEMPLATES:
            raise ValueError(
                f"word_problems level {level} is not valid; valid: {sorted(TEMPLATES)}"
            )
        self.task = task
        levels = [level] if level is not None else sorted(TEMPLATES)
        self.templates = [(lvl, name, fn) for lvl in levels for name, fn in TEMPLATES[lvl].items()]

    def sample(self, rng: np.random.Generator) -> tuple[str, dict[str, Any]]:
        lvl, name, fn = self.templates[int(rng.integers(len(self.templates)))]
        text, quantities, value = fn(rng)
        ex = {
            "id": f"{self.task}:{name}:" + ",".join(f"{k}={v}" for k, v in quantities.items()),
            "question": text,
            "answer": format_fraction(value),
            "template": name,
            "level": lvl,
            "quantities": dict(quantities),
            "task": self.task,
        }
        return ex["id"], ex  # the maths decides uniqueness, not the names in the story
