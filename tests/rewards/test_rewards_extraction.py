"""Answer extraction and equivalence on real-world answer strings."""

from fractions import Fraction

import pytest

from essa_jax.rewards import (
    answers_match,
    arith_reward,
    extract_answer,
    find_boxed,
    format_reward,
    math_reward,
    parse_number,
)

# (completion as a model or a dataset writes it, reference answer, should it be graded correct)
CASES = [
    # boxed, fractions, LaTeX
    (r"So the probability is $\boxed{\frac{3}{4}}$.", "0.75", True),
    (r"Thus $\boxed{0.75}$", r"\frac{3}{4}", True),
    (r"The answer is $\boxed{\dfrac{3}{4}}$", "3/4", True),
    (r"\boxed{\tfrac{1}{2}}", "0.5", True),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{3}", False),
    (r"\boxed{\frac34}", "0.75", True),
    (r"$\boxed{-\frac{2}{3}}$", "-2/3", True),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", True),
    (r"\boxed{2\sqrt{3}}", r"\sqrt{8}", False),
    (r"\boxed{\frac{\pi}{2}}", r"\pi/2", True),
    (r"\boxed{x^2+2x+1}", "(x+1)^2", True),
    (r"\boxed{(1,2)}", "(1, 2)", True),
    (r"\boxed{\{1,2\}}", r"\{2,1\}", True),
    (r"we get $x = 5$, so \boxed{x=5}", "5", True),
    (r"\boxed{\text{(A)}}", "A", True),
    # nested braces and \fbox, several boxes (the last one counts)
    (r"First \boxed{3}, then corrected: \boxed{\frac{1}{\sqrt{2}}}", r"\frac{\sqrt{2}}{2}", True),
    (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{\sqrt{3}}{2}", False),
    (r"\fbox{42}", "42", True),
    (r"\boxed{3} is wrong, \boxed{4}", "3", False),
    (r"\boxed 7", "7", True),
    # units, currency, percent, degrees
    (r"\boxed{5 \text{ cm}}", "5", True),
    ("The answer is 5 cm.", "5", True),
    (r"She pays $\boxed{\$5}$", "5", True),
    ("It costs $5.", "5", True),
    ("The answer is $18.50.", "18.5", True),
    (r"\boxed{50\%}", "50", True),
    (r"\boxed{90^\circ}", "90", True),
    ("The answer is 12 dollars.", "13", False),
    # commas in numbers, signs, decimals
    ("The total is 1,234.", "1234", True),
    (r"\boxed{1{,}234}", "1234", True),
    ("#### 1,234", "1,234", True),
    ("The final answer is -7", "-7", True),
    ("The final answer is -7", "7", False),
    ("The answer is 3.50.", "3.5", True),
    ("The answer is 0.3333", "1/3", False),
    # GSM8K "####" format
    ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "72", True),
    ("He has 3 + 4 = 7 apples.\n#### 7", "8", False),
    ("#### -15", "-15", True),
    # "The answer is ..."
    ("The answer is 12.", "12", True),
    ("So the answer is: 12", "12", True),
    ("Final Answer: The final answer is $\\frac{7}{2}$. I hope it is correct.", "3.5", True),
    ("the answer is 12 apples because she had 3 bags", "12", True),
    # last number fallback
    ("First 3 boxes, then 4 more: 7", "7", True),
    ("3 + 4 = 8", "7", False),
    ("I think it is 17", "71", False),
    # nothing to extract
    ("I don't know.", "3", False),
    ("", "0", False),
]


@pytest.mark.parametrize(("completion", "reference", "correct"), CASES)
def test_extract_and_match(completion, reference, correct):
    pred = extract_answer(completion)
    assert answers_match(pred, reference) is correct, (pred, reference)
    assert math_reward([""], [completion], answer=[reference]) == [1.0 if correct else 0.0]


def test_case_table_is_large():
    assert len(CASES) >= 40
    assert sum(not c for *_, c in CASES) >= 10


@pytest.mark.parametrize(
    ("text", "mode", "expected"),
    [
        (r"x \boxed{\frac{a}{\{b\}}} y", "auto", r"\frac{a}{\{b\}}"),
        (r"\boxed{1} \boxed{{2}}", "boxed", "{2}"),
        (r"\boxed{unclosed", "boxed", None),
        (r"the sum is 5, \boxed{ }", "auto", None),
        ("#### 72\n", "hash", "72"),
        ("no hash here", "hash", None),
        ("The answer is $\\frac{1}{2}$.", "answer_is", "\\frac{1}{2}"),
        ("79<|im_end|>", "first_number", "79"),
        ("79\nHuman: what is 3 + 4? 7", "first_number", "79"),
        (" -12 is it", "first_number", "-12"),
        ("1,234 and 5", "first_number", "1,234"),
        ("abc", "first_number", None),
        ("a 3, b 4.5, c 6", "last_number", "6"),
        ("1, 2, 3", "last_number", "3"),
    ],
)
def test_extraction_modes(text, mode, expected):
    assert extract_answer(text, mode) == expected


def test_extract_rejects_bad_mode_and_type():
    with pytest.raises(ValueError, match="first_number"):
        extract_answer("1", mode="firstnumber")
    with pytest.raises(TypeError, match="str"):
        extract_answer(12)


def test_find_boxed_nested():
    assert find_boxed(r"\boxed{a{b{c}}d} and \fbox{e}") == ["a{b{c}}d", "e"]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1,234", Fraction(1234)),
        ("-3.5", Fraction(-7, 2)),
        ("−4", Fraction(-4)),
        ("$5", Fraction(5)),
        ("\\$5.00", Fraction(5)),
        ("5 cm", Fraction(5)),
        ("5\\text{ cm}", Fraction(5)),
        ("50%", Fraction(50)),
        ("50\\%", Fraction(50)),
        ("3/4", Fraction(3, 4)),
        ("\\frac{3}{4}", Fraction(3, 4)),
        ("-\\dfrac{10}{4}", Fraction(-5, 2)),
        (".5", Fraction(1, 2)),
        ("12.", Fraction(12)),
        ("x+1", None),
        ("(1,2)", None),
        ("1/0", None),
        ("\\sqrt{2}", None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


def test_arith_reward_first_number():
    completions = ["79<|im_end|>", "79\n12 + 3 = 15", "80", "The sum is 79", "", "-5 and 79"]
    assert arith_reward([""] * 6, completions, answer=["79"] * 6) == [1, 1, 0, 1, 0, 0]


def test_format_reward():
    comps = [r"so \boxed{3}", r"\boxed{ }", "3", r"\boxed{\frac{1}{2}} end"]
    assert format_reward([""] * 4, comps) == [1.0, 0.0, 0.0, 1.0]


def test_reward_length_mismatch_is_clear():
    with pytest.raises(ValueError, match="'answer'"):
        math_reward(["a", "b"], ["1", "2"], answer=["1"])
