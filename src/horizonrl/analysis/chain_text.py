"""How the chat-chain detectors read what a role wrote: plain claims (an approval, a pass, a write),
the code expressions a sentence names, the details a run's output shows, and whether a turn talks
about the task at all.

A claim counts when it is plain: a sentence (outside code blocks) that asks, wishes or negates ("make
sure all tests pass", "I don't see a bug") is not a claim. A turn is *on the task* when it shares a
content word (of four letters or more, not a function word; ``numbers`` and ``number`` agree) with
the task's text or the code written so far, or uses a word of the job itself (code, function,
example, test, fix …), or quotes a number, code or a formula (``=``, ``/`` …).
"""

from __future__ import annotations

import re

_HEDGE = re.compile(  # words that make a claim a wish, a question or a negation
    r"\b(?:make sure|ensure|until|so that|should|must|needs?|if|whether|verify|check|let me|let's|will|"
    r"would|could|can|once|not|no|nothing|without|any)\b|n't|\?",
    re.IGNORECASE,
)
WRITE_CLAIM = re.compile(
    r"\bI(?:'ve| have)?\s+(?:now\s+|just\s+|already\s+)?"
    r"(?:written|wrote|updated|fixed|rewritten|rewrote|corrected)\b"
)
PASS_CLAIM = re.compile(
    r"\b(?:tests?|examples?)\s+(?:now\s+|all\s+)?pass(?:es|ed)?\b"
    r"|\bpass(?:es)?\s+all\s+(?:the\s+)?(?:tests|examples)\b",
    re.IGNORECASE,
)
WRONG_CLAIM = re.compile(r"\b(?:incorrect|wrong|bugs?|buggy|fails)\b", re.IGNORECASE)
APPROVAL = re.compile(
    r"\b(?:(?:is|are|looks?|seems?)\s+(?:now\s+|all\s+)?(?:correct|right|fine|good)|(?:great|good) job|"
    r"well done|works|lgtm|approved?)\b",
    re.IGNORECASE,
)
RUN_PLAN = re.compile(
    r"\b(?:I will|I'll|I am going to|I'm going to|let me|I now)\s+(?:now\s+)?(?:re-?)?run\b", re.IGNORECASE
)
DEFECT = re.compile(r"fail|error|wrong|bug|crash|incorrect|missing|edge case|should", re.IGNORECASE)
REPORTS_FAILURE = re.compile(r"fail|error|exception|traceback|timed out|\bwrong\b|broken", re.IGNORECASE)
_DIAGNOSES = re.compile(
    r"fail|error|wrong|broken|\bmiss|\bnot\b|n't|never|instead of|\b(?:expected|gives|returns)\b",
    re.IGNORECASE,
)
_NEGATED = re.compile(r"\b(?:not|no|never|instead of|rather than)\b|n't", re.IGNORECASE)
# a call or a subscript (``range(n + 1)``, ``result[:-1]``, ``s.lower()``) or a `quoted` span
_CODE_TERM = re.compile(r"`([^`\n]+)`|([A-Za-z_][\w.]*(?:\([^()\n]*\)|\[[^\[\]\n]*\]))")
_USES = re.compile(r"\b(?:use|uses|using|with|via|call|calls|calling)\s+(?:an?\s+|the\s+)?$", re.IGNORECASE)
_FIRST_PERSON = re.compile(r"\bI\b|\bI'(?:ll|ve|m|d)\b")
_FENCED = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_JOB = re.findall(
    r"\w+",
    "code function example test run fix bug error fail pass return input output argument parameter "
    "signature file solution loop review report implement write result value case edge check call "
    "design algorithm import type docstring",
)
_FUNCTION_WORDS = set(
    re.findall(
        r"\w+",
        "about also because been before both does doing done each even from have having here into just "
        "like many more most much only other over same should some such than that their them then there "
        "these they this those very want wants were what when where which while will with would your "
        "yours really thing things something anything everything",
    )
)


def prose(text: str) -> str:
    """``text`` without its fenced code blocks."""
    return _FENCED.sub(" ", text)


def sentences(text: str) -> list[str]:
    """The sentences of ``text``'s prose (split at . ! ? and line ends; a dot inside a word stays)."""
    return [s for s in re.split(r"(?<=[.!?])\s+|\n+", prose(text)) if s.strip()]


def claims(pattern: re.Pattern[str], text: str) -> bool:
    """``text`` (outside code blocks) makes the claim plainly: no hedge earlier in its sentence."""
    plain = prose(text)
    for match in pattern.finditer(plain):
        start = max(plain.rfind(c, 0, match.start()) for c in ".!\n")
        end = min([i for i in (plain.find(c, match.end()) for c in ".!\n") if i >= 0] or [len(plain)])
        if not _HEDGE.search(plain[start + 1 : end]):
            return True
    return False


def squeeze(text: str) -> str:
    """``text`` without whitespace, its double quotes as single ones (how code is compared)."""
    return re.sub(r"\s+", "", text).replace('"', "'")


def code_terms(text: str) -> list[str]:
    """The code expressions ``text``'s prose names, without spaces (``name()`` as ``name(``)."""
    terms = [squeeze(m.group(1) or m.group(2)) for m in _CODE_TERM.finditer(prose(text))]
    return [t[:-1] if t.endswith("()") else t for t in terms if t]


def own_uses(text: str, entry_point: str) -> list[str]:
    """The code expressions a first-person sentence of ``text`` says the role uses ("I will use
    range(n + 1)", "I'll drop it with result[:-1]"), calls of the task's function left out."""
    out: list[str] = []
    for sentence in sentences(text):
        if not _FIRST_PERSON.search(sentence) or _NEGATED.search(sentence):
            continue
        for m in _CODE_TERM.finditer(sentence):
            term = squeeze(m.group(1) or m.group(2))
            if _USES.search(sentence[: m.start()]) and not term.startswith(f"{entry_point}("):
                out.append(term[:-1] if term.endswith("()") else term)
    return out


def _stem(word: str) -> str:
    word = word.lower()
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 4:
            word = word[: -len(suffix)]
            break
    return word[:5]


def topic(*texts: str) -> set[str]:
    """The stems of the content words (and identifier parts) of ``texts``, with the job's words."""
    words = {w for t in texts for w in re.findall(r"[A-Za-z]+", t.replace("_", " "))}
    return {_stem(w) for w in (*words, *_JOB) if len(w) >= 4 and w.lower() not in _FUNCTION_WORDS}


def off_topic(text: str, vocabulary: set[str], min_words: int = 12) -> bool:
    """``text`` is talk of at least ``min_words`` words that quotes no number, code or formula and
    shares no content word with ``vocabulary`` (see :func:`topic`)."""
    plain = prose(text)
    words = re.findall(r"[A-Za-z']+", plain)
    if len(words) < min_words or re.search(r"[\d`=<>/*+]", plain) or code_terms(plain):
        return False
    content = {_stem(w) for w in words if len(w) >= 4 and w.lower() not in _FUNCTION_WORDS}
    return not content & vocabulary


_NOT_DETAIL = re.compile(
    r"^(?:\[(?:exit code -?\d+|timed out|stderr)\]|\*+|\d+ of \d+ examples passed|Wrote \d+ lines? .*|"
    r"Failed example:|Expected:|Got:|Got nothing|Exception raised:|Traceback .*|File \".*|\^+)$"
)
_VALUE = re.compile(
    r"'[^'\n]*'|\"[^\"\n]*\"|-?\d+(?:\.\d+)?|\b(?:True|False|None)\b|\b\w+(?:Error|Exception)\b"
)


def details(observation: str, entry_point: str = "") -> set[str]:
    """What a run's output shows that a report could pass on: its lines (a failed example's call,
    the expected and the got values, what a snippet printed), and the values and error names in them
    (the task function's bare name is no detail)."""
    found: set[str] = set()
    for raw in observation.splitlines():
        line = raw.strip()
        if not line or _NOT_DETAIL.match(line):
            continue
        found.add(squeeze(line))
        values = _VALUE.findall(line)
        found |= {squeeze(v) for v in values}
        found |= {v[1:-1] for v in values if re.fullmatch(r"['\"][A-Za-z_]\w{2,}['\"]", v)}  # 'Counter'

    return {d for d in found if d and d != entry_point}


def passes_on(text: str, shown: set[str], code_names: set[str] | None = None) -> bool:
    """``text`` quotes one of the details ``shown`` (a value as a whole token), or diagnoses the
    failure in terms of the code (a failure word and a code expression it names, or one of the code's
    ``code_names``)."""
    plain = prose(text)
    named = any(re.search(rf"\b{re.escape(n)}\b", plain) for n in code_names or ())
    if _DIAGNOSES.search(plain) and (code_terms(text) or named):
        return True
    flat = squeeze(text)
    for detail in shown:
        if re.fullmatch(r"-?\d+(?:\.\d+)?", detail):
            if re.search(rf"(?<![\w.]){re.escape(detail)}(?![\w]|\.\d)", text):
                return True
        elif detail in flat:
            return True
    return False
