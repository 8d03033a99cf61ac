"""Final answers in free text: extraction, checking against a task's answer, and majority votes.

Roles write prose; the answer is the number after the last ``Answer:`` (also ``final answer is``,
``\\boxed{}``, ``####``), or else the last number of the text. A text with no number has no answer
(the episode's reward is 0 and it is counted, never raised).
"""

from __future__ import annotations

import re
from fractions import Fraction

from horizonrl.stats import majority_vote as majority_vote  # the vote lives with the estimators (maj@k)

_NUMBER = r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?"
_MARKED = re.compile(
    r"(?:answer\s*(?:is)?\s*[:=]?|\\boxed\{|####)\s*\$?\s*(" + _NUMBER + r")",
    re.IGNORECASE,
)
_ANY = re.compile(_NUMBER)


def _normalize(raw: str) -> str | None:
    text = raw.replace(",", "").rstrip(".")
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def extract_answer(text: str, marked_only: bool = False) -> str | None:
    """The text's final answer as a normalized number (``"1,200"`` -> ``"1200"``, ``"2.50"`` ->
    ``"5/2"``), or None when it states none. ``marked_only``: only a number marked as the answer
    counts (not the text's last number)."""
    marked = _MARKED.findall(text)
    candidates = marked if marked or marked_only else _ANY.findall(text)
    for raw in reversed(candidates):
        value = _normalize(raw)
        if value is not None:
            return value
    return None


def is_correct(answer: str | None, truth: object) -> bool:
    """Whether an extracted answer equals the task's answer (numerically)."""
    if answer is None:
        return False
    expected = _normalize(str(truth))
    return expected is not None and answer == expected
