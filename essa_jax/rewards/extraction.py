"""Final-answer extraction from model completions and a fast parser for plain numbers.

`extract_answer(text)` returns the final answer *as written* (a substring of the completion, lightly
trimmed), following the conventions math graders use (Hendrycks et al. 2021 MATH `\\boxed{}`;
Cobbe et al. 2021 GSM8K `#### N`): the last `\\boxed{...}` / `\\fbox{...}` (nested braces allowed),
else the last `#### ...`, else the last "The (final) answer is ...", else the last number.

The prefilled arithmetic format ("A + B = " already in the assistant turn) has its own rule: the
completion is e.g. "79<|im_end|>" or "79\\n...", and the answer is the *first* number of the
completion (`mode="first_number"`): whatever the model rambles on about afterwards does not count.

`parse_number(s)` turns plain numeric answers ("1,234", "-3.5", "$5", "5 cm", "50%", "3/4",
"\\frac{3}{4}") into an exact `fractions.Fraction`, or None when `s` is not a plain number; it is
the fast path of `answers_match` (no sympy for the common case).
"""

from __future__ import annotations

import re
from fractions import Fraction

EXTRACTION_MODES = ("auto", "boxed", "hash", "answer_is", "last_number", "first_number")

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\b")
# A number as written in prose: optional sign, thousands groups or plain digits, decimals, and an
# optional "/denominator" (simple fractions such as 3/4). ".5" is accepted too.
_NUMBER_RE = re.compile(r"(?<![\w.])[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+|(?=\.\d))(?:\.\d+)?(?:/\d+)?")
_HASH_RE = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS_RE = re.compile(
    r"(?:final\s+answer|the\s+answer|answer)\s*(?:is|:|=)\s*:?\s*([^\n]*)", re.IGNORECASE
)


def find_boxed(text: str) -> list[str]:
    """Contents of every `\\boxed{...}` / `\\fbox{...}` in `text`, in order (nested braces kept).

    `\\boxed 5` (no braces, the argument is the next token) is accepted too. An unclosed brace
    ends the search: the truncated box is not an answer.
    """
    out = []
    pos = 0
    while True:
        m = _BOXED_RE.search(text, pos)
        if m is None:
            return out
        i = m.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{" and (j == 0 or text[j - 1] != "\\"):
                    depth += 1
                elif text[j] == "}" and text[j - 1] != "\\":
                    depth -= 1
                    if depth == 0:
                        out.append(text[i + 1 : j])
                        pos = j + 1
                        break
            else:
                return out
        elif i > m.end():
            tok = re.match(r"[^\s$]+", text[i:])
            if tok is None:
                return out
            out.append(tok.group(0))
            pos = i + tok.end()
        else:
            pos = m.end()


def _clean(ans: str) -> str:
    """Trim what surrounds an answer in prose: spaces, a trailing period, `$...$`, `\\(...\\)`."""
    ans = ans.strip()
    # A sentence-final period is never part of the answer ("12." is 12 anyway).
    while ans.endswith((".", "!")):
        ans = ans[:-1].rstrip()
    for left, right in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if ans.startswith(left) and ans.endswith(right) and len(ans) >= len(left) + len(right):
            ans = ans[len(left) : len(ans) - len(right)].strip()
    if ans.count("$") == 1 and ans.endswith("$"):
        ans = ans[:-1].rstrip()
    if ans.count("$") == 1 and ans.startswith("$") and not re.match(r"\$\s*\d", ans):
        ans = ans[1:].lstrip()
    return ans


def _numbers(text: str) -> list[str]:
    return [m.group(0) for m in _NUMBER_RE.finditer(text)]


def extract_answer(text: str, mode: str = "auto") -> str | None:
    """The final answer of a completion as written, or None when there is none.

    Args:
      text: the completion (any trailing special tokens such as "<|im_end|>" are harmless).
      mode: "auto" (last `\\boxed{}`/`\\fbox{}`, else last `####`, else last "The answer is ...",
        else last number), one of those rules alone ("boxed", "hash", "answer_is", "last_number"),
        or "first_number" (the prefilled arithmetic format: the first number of the completion).
    """
    if mode not in EXTRACTION_MODES:
        raise ValueError(f"extract_answer mode {mode!r} is not valid; valid: {EXTRACTION_MODES}")
    if not isinstance(text, str):
        raise TypeError(f"extract_answer expects a str completion, got {type(text).__name__}")
    if mode == "first_number":
        nums = _numbers(text)
        return nums[0].replace("−", "-") if nums else None
    if mode in ("auto", "boxed"):
        boxed = find_boxed(text)
        if boxed:
            return _clean(boxed[-1]) or None  # an empty box is no answer
        if mode == "boxed":
            return None
    if mode in ("auto", "hash"):
        hashes = _HASH_RE.findall(text)
        hashes = [h for h in hashes if h.strip()]
        if hashes:
            return _clean(hashes[-1])
        if mode == "hash":
            return None
    if mode in ("auto", "answer_is"):
        found = [a for a in _ANSWER_IS_RE.findall(text) if _clean(a)]
        if found:
            ans = _clean(found[-1])
            # "The answer is 12 apples because ..." -> keep the leading expression only when the
            # sentence goes on in prose; a bare number followed by words is the number.
            m = re.match(r"^([-+−]?[\d,]*\.?\d+(?:/\d+)?)\s+[A-Za-z]", ans)
            return m.group(1) if m else ans
        if mode == "answer_is":
            return None
    nums = _numbers(text)
    return nums[-1].replace("−", "-") if nums else None


# ---------------------------------------------------------------------------------------------
# plain numbers

_FRAC_RE = re.compile(r"^([-+]?)\\[dt]?frac\s*\{\s*([-+]?\d+)\s*\}\s*\{\s*(\d+)\s*\}$")
_FRAC_SHORT_RE = re.compile(r"^([-+]?)\\[dt]?frac(\d)(\d)$")
_SLASH_RE = re.compile(r"^([-+]?\d+)\s*/\s*(\d+)$")
_DECIMAL_RE = re.compile(r"^[-+]?(?:\d{1,3}(?:,\d{3})+|\d+|\d*(?=\.\d))(?:\.\d+)?$")
# Units and currency words that may follow a number in an answer ("5 cm", "12 dollars").
_UNIT_TAIL_RE = re.compile(
    r"^(.*?\d)\s*(?:\\(?:text|mbox|mathrm)\s*\{[^{}]*\}|[A-Za-z][A-Za-z .]*)$"
)


def parse_number(s: str) -> Fraction | None:
    """Exact value of a plain numeric answer, or None when `s` is not one.

    Accepts signs (incl. U+2212), thousands commas ("1,234"), decimals, "a/b", `\\frac{a}{b}`
    (`\\dfrac`, `\\tfrac`, `\\frac34`), currency ("$5", "\\$5"), a trailing percent sign (stripped:
    "50%" is 50, matching how GSM8K-style references are written), degrees and unit words
    ("5 cm", "5\\text{ cm}"). Anything else (expressions, intervals, symbols) returns None so the
    caller can fall back to symbolic comparison.
    """
    if not isinstance(s, str):
        return None
    t = s.strip().replace("−", "-")
    t = re.sub(r"\\[,!;: ]|~", "", t)  # LaTeX thin spaces
    t = t.replace("{,}", ",")
    t = t.strip("$ ").replace("\\$", "").strip()
    t = re.sub(r"\^\s*\{?\\circ\}?|°", "", t)
    t = re.sub(r"\\?%$", "", t).strip()
    if t.startswith("\\left(") or t.startswith("("):
        return None
    m = _UNIT_TAIL_RE.match(t)
    if m and not re.search(r"\\frac", t):
        t = m.group(1)
    t = t.rstrip(".").strip() if re.search(r"\d\.$", t) else t
    t = t.replace(" ", "")
    if _DECIMAL_RE.match(t):
        sign = -1 if t.startswith("-") else 1
        body = t.lstrip("+-").replace(",", "")
        return sign * Fraction(body)
    m = _SLASH_RE.match(t)
    if m:
        den = int(m.group(2))
        return Fraction(int(m.group(1)), den) if den else None
    m = _FRAC_RE.match(t) or _FRAC_SHORT_RE.match(t)
    if m:
        den = int(m.group(3))
        if den == 0:
            return None
        val = Fraction(int(m.group(2)), den)
        return -val if m.group(1) == "-" else val
    return None
