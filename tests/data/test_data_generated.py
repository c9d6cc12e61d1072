"""Generated tasks: deterministic per seed, exact answers, disjoint train / held-out sets."""

import ast
import operator
import re
from fractions import Fraction

import pytest

from essa_jax.data import generate_task, load_task

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _eval(expr: str) -> int:
    """Independent evaluation of an arithmetic expression through Python's own parser."""

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.BinOp):
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise AssertionError(f"unexpected node {node}")

    return ev(ast.parse(expr, mode="eval"))


@pytest.mark.parametrize(
    "name",
    [
        "add_1d",
        "add_2d",
        "add_3d",
        "sub_2d",
        "sub_3d",
        "mul_1d",
        "mul_2d",
        "arith_mixed",
        "arith_mixed_l1",
        "arith_mixed_l3",
        "word_problems",
        "word_problems_l2",
    ],
)
def test_deterministic_and_disjoint(name):
    train, evals = generate_task(name, num_train=60, num_eval=30, seed=3)
    again_train, again_eval = generate_task(name, num_train=60, num_eval=30, seed=3)
    assert train == again_train and evals == again_eval
    other_train, _ = generate_task(name, num_train=60, num_eval=30, seed=4)
    assert [e["question"] for e in other_train] != [e["question"] for e in train]
    assert len(train) == 60 and len(evals) == 30
    questions = [e["question"] for e in train + evals]
    assert len(set(questions)) == len(questions)  # distinct, hence disjoint
    assert len({e["id"] for e in train + evals}) == 90
    for e in train + evals:
        assert isinstance(e["answer"], str) and e["answer"]
        assert e["prompt"] == e["question"]


def test_eval_set_does_not_depend_on_num_train():
    _, ev1 = generate_task("add_2d", num_train=10, num_eval=20, seed=0)
    _, ev2 = generate_task("add_2d", num_train=500, num_eval=20, seed=0)
    assert ev1 == ev2
    _, ev3 = generate_task("word_problems", num_train=10, num_eval=20, seed=0)
    _, ev4 = generate_task("word_problems", num_train=300, num_eval=20, seed=0)
    assert ev3 == ev4


@pytest.mark.parametrize(
    ("name", "lo", "hi"), [("add_1d", 0, 9), ("add_2d", 10, 99), ("mul_3d", 100, 999)]
)
def test_binary_answers_and_format(name, lo, hi):
    train, evals = generate_task(name, num_train=80, num_eval=20, seed=1)
    sym = {"add": "+", "sub": "-", "mul": "*"}[name[:3]]
    for e in train + evals:
        m = re.fullmatch(rf"What is (\d+) \{sym} (\d+)\?", e["question"])
        assert m, e["question"]
        a, b = int(m.group(1)), int(m.group(2))
        assert lo <= a <= hi and lo <= b <= hi
        assert int(e["answer"]) == _eval(f"{a} {sym} {b}")
        assert e["prefill"] == f"{a} {sym} {b} = "


def test_subtraction_sign_option():
    train, _ = generate_task("sub_2d", num_train=300, num_eval=0, seed=2)
    assert all(int(e["answer"]) >= 0 for e in train)
    neg, _ = generate_task("sub_2d", num_train=300, num_eval=0, seed=2, allow_negative=True)
    assert any(int(e["answer"]) < 0 for e in neg)
    for e in neg:
        assert int(e["answer"]) == _eval(e["expression"])


def test_small_space_is_exhaustive_and_too_large_request_errors():
    train, evals = generate_task("add_1d", num_train=90, num_eval=10, seed=0)
    assert len({e["expression"] for e in train + evals}) == 100  # all 10 x 10 pairs
    with pytest.raises(ValueError, match="only 100 distinct"):
        generate_task("add_1d", num_train=95, num_eval=10, seed=0)
    # sub_1d without negatives: pairs a >= b, 55 of them.
    train, _ = generate_task("sub_1d", num_train=55, num_eval=0, seed=0)
    pairs = {tuple(map(int, e["expression"].split(" - "))) for e in train}
    assert pairs == {(a, b) for a in range(10) for b in range(a + 1)}


@pytest.mark.parametrize("level", [1, 2, 3])
def test_mixed_expressions_respect_precedence(level):
    train, _ = generate_task(f"arith_mixed_l{level}", num_train=200, num_eval=0, seed=level)
    for e in train:
        assert int(e["answer"]) == _eval(e["expression"]), e["expression"]
        assert e["question"] == f"What is {e['expression']}?"
    exprs = " ".join(e["expression"] for e in train)
    if level >= 2:
        assert "*" in exprs
    if level == 3:
        assert "(" in exprs


# Independent recomputation of every word-problem template from its quantities.
WORD_FORMULAS = {
    "buy_more": lambda q: Fraction(q["a"] + q["b"]),
    "give_away": lambda q: Fraction(q["a"] - q["b"]),
    "boxes": lambda q: Fraction(q["a"] * q["b"]),
    "share": lambda q: Fraction(q["a"], q["b"]),
    "change": lambda q: Fraction(q["m"] - q["a"] * q["p"]),
    "savings": lambda q: Fraction(q["a"] * q["w"] - q["s"]),
    "fraction_of": lambda q: q["n"] * (1 - Fraction(q["num"], q["den"])),
    "garden": lambda q: Fraction(q["r"] * q["c"] * q["t"] - q["s"]),
    "discount": lambda q: q["p"] * Fraction(100 - q["d"], 100) - q["c"],
    "average_speed": lambda q: Fraction(q["v1"] * q["h1"] + q["v2"] * q["h2"], q["h1"] + q["h2"]),
}


def test_word_problem_answers_recomputed():
    train, evals = generate_task("word_problems", num_train=400, num_eval=50, seed=7)
    seen = set()
    for e in train + evals:
        q = e["quantities"]
        seen.add(e["template"])
        expected = WORD_FORMULAS[e["template"]](q)
        assert expected > 0
        assert Fraction(e["answer"]) == expected, e
        for v in q.values():  # every quantity is stated in the question text
            assert re.search(rf"(?<!\d){v}(?!\d)", e["question"]), (v, e["question"])
    assert seen == set(WORD_FORMULAS)


def test_word_problem_levels():
    for level, expected in [
        (1, {"buy_more", "give_away", "boxes", "share"}),
        (3, {"garden", "discount", "average_speed"}),
    ]:
        train, _ = generate_task(f"word_problems_l{level}", num_train=100, num_eval=0, seed=0)
        assert {e["template"] for e in train} == expected
        assert all(e["level"] == level for e in train)


def test_unknown_task_names():
    with pytest.raises(ValueError, match="add_2d"):
        generate_task("addition", num_train=1, num_eval=1)
    with pytest.raises(ValueError, match="level"):
        generate_task("arith_mixed_l7", num_train=1, num_eval=1)


def test_load_task_generated_defaults():
    task = load_task({"name": "add_2d", "num_train": 50, "num_eval": 10, "seed": 0})
    assert task.prompt_format == "prefill" and task.reward == "arith"
    assert len(task.train) == 50 and len(task.eval) == 10
    word = load_task({"name": "word_problems", "num_train": 5, "num_eval": 5})
    assert word.prompt_format == "chat" and word.reward == "math"
    with pytest.raises(ValueError, match="num_trian"):
        load_task({"name": "add_2d", "num_trian": 5})
