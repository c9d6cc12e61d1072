"""Answer equivalence: an exact numeric fast path, then math-verify under a wall-clock bound.

`answers_match(predicted, reference)` compares two *answers* (not whole completions; run
`extract_answer` first). When both are plain numbers (`parse_number`), they are compared exactly as
fractions: "0.75" == "\\frac{3}{4}" == "3/4", "1,234" == "1234", "$5" == "5". Otherwise both are
handed to math-verify (`parse` + `verify`, HF 2025), which handles LaTeX expressions, intervals,
sets, equations ("x=5" vs "5"), percentages and units. math-verify can hang on pathological inputs;
the call is bounded by `call_with_timeout` (works off the main thread too) and a timeout or an
internal error counts as "no match" and is recorded in `VERIFY_STATS`.
"""

from __future__ import annotations

import re

from .extraction import parse_number
from .stats import RewardStats
from .timeout import RewardTimeoutError, call_with_timeout

DEFAULT_VERIFY_TIMEOUT_S = 5.0
_INT_RE = re.compile(r"[-+]?\d+\Z")

# Timeouts and internal errors of the symbolic path, for the loops to log.
VERIFY_STATS = RewardStats()


def _strip_math_delims(s: str) -> str:
    s = s.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            return s[len(left) : len(s) - len(right)].strip()
    return s


def _symbolic_match(predicted: str, reference: str) -> bool:
    # Imported lazily: math-verify pulls in sympy (~0.7 s) which the numeric path never needs.
    from math_verify import grader, parse, parser, verify

    # Its own (main-thread-only) timeout is off because call_with_timeout bounds the call; the
    # "timeout is disabled" warning it would log once per process is therefore misleading.
    grader.TIMEOUT_WARNING_SHOWN = parser.TIMEOUT_WARNING_SHOWN = True

    # Wrapping in \boxed{} makes math-verify take the whole string as the answer (its highest
    # priority extraction) instead of searching it for something that looks like one.
    gold = parse("\\boxed{" + reference + "}", parsing_timeout=None)
    pred = parse("\\boxed{" + predicted + "}", parsing_timeout=None)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=None))


def answers_match(
    predicted: str | None,
    reference: str,
    *,
    timeout_s: float | None = DEFAULT_VERIFY_TIMEOUT_S,
    symbolic: bool = True,
) -> bool:
    """True when the predicted answer equals the reference answer.

    Args:
      predicted: the model's answer (e.g. `extract_answer(completion)`); None never matches.
      reference: the ground-truth answer string.
      timeout_s: bound on the math-verify call (None: unbounded). A timeout returns False.
      symbolic: False skips math-verify (numeric answers only; exact string match otherwise).
    """
    if predicted is None:
        return False
    if not isinstance(predicted, str) or not isinstance(reference, str):
        raise TypeError(
            "answers_match expects str answers, got "
            f"predicted={type(predicted).__name__}, reference={type(reference).__name__}"
        )
    predicted = _strip_math_delims(predicted)
    reference = _strip_math_delims(reference)
    if not predicted or not reference:
        return False
    if _INT_RE.match(predicted) and _INT_RE.match(reference):  # the arithmetic tasks' hot path
        return int(predicted) == int(reference)
    a, b = parse_number(predicted), parse_number(reference)
    if a is not None and b is not None:
        return a == b
    if predicted.replace(" ", "") == reference.replace(" ", ""):
        return True
    if not symbolic:
        return False
    VERIFY_STATS.record_calls(1)
    try:
        return call_with_timeout(_symbolic_match, timeout_s, predicted, reference)
    except RewardTimeoutError as e:
        VERIFY_STATS.record_timeout(f"{predicted!r} vs {reference!r}: {e}")
    except Exception as e:  # a grader error is a non-match, never a crashed run
        VERIFY_STATS.record_failure(e)
    return False
