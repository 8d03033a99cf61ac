"""The arithmetic word problems of the ``calc`` env, generated deterministically from an rng.

A problem is a short story about a quantity (bolts in a warehouse, eggs on a farm, ...) that goes
through a chain of additions, subtractions, multiplications and exact divisions with multi-digit
numbers. Every intermediate result is a positive integer; ``steps`` holds the expressions computing
them (the calc env's oracle replays them, its step credit compares against them) and ``clauses``
the sentence of the question each step comes from. Nothing here knows about envs, tools or rewards:
:func:`generate_problem` maps an rng's state to a problem, and :mod:`horizonrl.envs.calc` decides
which rng (split, seed, index) and how many steps.
"""

from __future__ import annotations

import random
from typing import Any

# place, unit (plural), container (plural; "N boxes with M bolts each"), groups ("singular/plural")
_SCENARIOS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("warehouse", "bolts", "boxes", ("crate/crates", "bin/bins", "van/vans")),
    ("library", "books", "shelves", ("cart/carts", "classroom/classrooms", "reading room/reading rooms")),
    ("farm", "eggs", "cartons", ("basket/baskets", "market stall/market stalls", "truck/trucks")),
    ("bakery", "cookies", "trays", ("tin/tins", "bag/bags", "shop/shops")),
    ("orchard", "apples", "trees", ("crate/crates", "barrel/barrels", "stall/stalls")),
    ("print shop", "stickers", "sheets", ("envelope/envelopes", "packet/packets", "school/schools")),
    ("factory", "screws", "bags", ("drawer/drawers", "toolbox/toolboxes", "workshop/workshops")),
    ("seed company", "seeds", "packets", ("tray/trays", "greenhouse/greenhouses", "garden bed/garden beds")),
    ("food bank", "cans", "cases", ("box/boxes", "shelf/shelves", "van/vans")),
    ("school", "pencils", "packs", ("classroom/classrooms", "cup/cups", "drawer/drawers")),
    ("toy store", "marbles", "jars", ("bag/bags", "pouch/pouches", "shelf/shelves")),
    ("post office", "letters", "sacks", ("mailbag/mailbags", "tray/trays", "truck/trucks")),
)
_GENERIC_GROUPS = ("pile/piles", "parcel/parcels", "batch/batches", "bundle/bundles")

_OPEN_PLAIN = (
    "{A} has {n} {unit}.",
    "There are {n} {unit} in {a}.",
    "{A} starts the day with {n} {unit}.",
    "At the start of the month, {a} stores {n} {unit}.",
)
_OPEN_MUL = (
    "{A} has {n} {container} with {k} {unit} each.",
    "{A} holds {n} {container} of {k} {unit} each.",
    "There are {n} {container} in {a}, and each one contains {k} {unit}.",
)
_ADD = (
    "{H} then gets {n} more {unit}.",
    "{N} more {unit} are added to {h}.",
    "A delivery brings {n} extra {unit} to {h}.",
    "Later, {h} receives another {n} {unit}.",
)
_SUB = (
    "{N} {unit} are then taken out of {h}.",
    "{H} gives away {n} {unit}.",
    "{N} of the {unit} in {h} turn out to be damaged and are thrown away.",
    "Then {n} {unit} are sold from {h}.",
)
_MUL_NEW_HOLDER = ("A {ordinal} {place} has {k} times as many {unit} as {h}.",)
_MUL_SAME_HOLDER = (
    "{H} is restocked until it holds {k} times as many {unit} as before.",
    "Over the next week, the number of {unit} in {h} grows {k}-fold.",
)
_DIV = (
    "The {unit} in {h} are split equally into {k} {groups}.",
    "{H} shares its {unit} equally among {k} {groups}.",
    "All the {unit} in {h} are packed equally into {k} {groups}.",
)
_QUESTION = (
    "How many {unit} are in {h} now?",
    "How many {unit} does {h} have at the end?",
    "What is the final number of {unit} in {h}?",
)
_ORDINALS = ("second", "third", "fourth", "fifth")


def _article(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


def _plan(rng: random.Random, n_ops: int) -> list[str]:
    """The kinds of the operations: no two mul or two div in a row, at most two muls, and at
    least one mul or div when there are two or more steps (pure sums are too easy)."""
    kinds: list[str] = []
    for _ in range(n_ops):
        allowed = ["add", "sub", "mul", "div"]
        if kinds and kinds[-1] in ("mul", "div"):
            allowed.remove(kinds[-1])
        if kinds.count("mul") >= 2 and "mul" in allowed:
            allowed.remove("mul")
        kinds.append(rng.choice(allowed))
    if n_ops >= 2 and not {"mul", "div"} & set(kinds):
        kinds[0] = "mul"
    return kinds


def _generate_once(rng: random.Random, n_ops: int, max_digits: int) -> dict[str, Any] | None:
    """One attempt at a problem; None when the draws led to a dead end (no exact divisor)."""
    place, unit, container, scenario_groups = rng.choice(_SCENARIOS)
    groups = [g for g in scenario_groups + _GENERIC_GROUPS if g.split("/")[1] not in (unit, container)]
    rng.shuffle(groups)
    commas = rng.random() < 0.7
    factor_max = 10 ** min(2, max_digits) - 1
    min_quotient = max(2, 10 ** (max_digits - 2))  # a division must leave a sizeable number

    def num(x: int) -> str:
        return f"{x:,}" if commas else str(x)

    def operand(spread: int = 2) -> int:  # mostly long numbers: they are what makes it hard
        digits = rng.randint(max(1, max_digits - spread), max_digits)
        return rng.randint(max(2, 10 ** (digits - 1)), 10**digits - 1)

    used: set[str] = set()

    def pick(templates: tuple[str, ...]) -> str:  # no sentence twice in one problem if avoidable
        fresh = [t for t in templates if t not in used] or list(templates)
        choice = rng.choice(fresh)
        used.add(choice)
        return choice

    def factor() -> int:
        return rng.randint(2, factor_max)

    words = {"A": _cap(_article(place)), "a": _article(place), "place": place, "unit": unit}
    words["container"] = container
    holder = f"the {place}"
    kinds = _plan(rng, n_ops)
    sentences: list[str] = []
    steps: list[str] = []
    pending_k: int | None = None  # divisor the next div step was prepared for
    last_mul = 0
    muls_seen = 0
    v = 0
    for i, kind in enumerate(kinds):
        nxt = kinds[i + 1] if i + 1 < n_ops else None
        fill = {**words, "h": holder, "H": _cap(holder)}
        if i == 0 and kind == "mul":
            b = factor()
            a = operand(0 if b < 10 else 1)
            steps.append(f"{a} * {b}")
            sentences.append(pick(_OPEN_MUL).format(**fill, n=num(a), k=b))
            v, last_mul = a * b, b
            continue
        if i == 0:
            v = operand(0)
            if kind == "div":
                pending_k = factor()
                v = max(min_quotient, v) * pending_k
            sentences.append(pick(_OPEN_PLAIN).format(**fill, n=num(v)))
        if kind == "sub" and v < 3:  # amounts are >= 2 ("1 bolts" reads badly) and leave >= 1
            kind = "add"
        if kind == "add":
            n = operand()
            if nxt == "div":
                pending_k = factor()
                r = (v + n) % pending_k
                n = n - r if r and n - r >= 2 else n + (pending_k - r) % pending_k
            steps.append(f"{v} + {n}")
            sentences.append(pick(_ADD).format(**fill, n=num(n), N=_cap(num(n))))
            v += n
        elif kind == "sub":
            n = operand()
            if n > 3 * v // 4:  # take a part, leaving at least a quarter
                n = rng.randint(max(2, v // 10), max(2, 3 * v // 4))
            if nxt == "div":
                k = factor()
                rest = (v - n) - (v - n) % k
                if rest >= min_quotient * k:
                    n, pending_k = v - rest, k
            steps.append(f"{v} - {n}")
            sentences.append(pick(_SUB).format(**fill, n=num(n), N=_cap(num(n))))
            v -= n
        elif kind == "mul":
            k = factor()
            if rng.random() < 0.5 and muls_seen < len(_ORDINALS):
                sentence = pick(_MUL_NEW_HOLDER).format(**fill, k=k, ordinal=_ORDINALS[muls_seen])
                holder = f"the {_ORDINALS[muls_seen]} {place}"
                muls_seen += 1
            else:
                sentence = pick(_MUL_SAME_HOLDER).format(**fill, k=k)
            steps.append(f"{v} * {k}")
            sentences.append(sentence)
            v, last_mul = v * k, k
        else:  # div
            if pending_k and v % pending_k == 0 and v // pending_k >= min_quotient:
                k = pending_k
            else:
                divisors = [d for d in range(2, factor_max + 1) if v % d == 0 and v // d >= min_quotient]
                divisors = [d for d in divisors if d != last_mul] or divisors
                if not divisors:
                    return None
                k = rng.choice([d for d in divisors if d > 2] or divisors)
            single, plural = groups.pop().split("/")
            steps.append(f"{v} / {k}")
            sentences.append(pick(_DIV).format(**fill, k=k, groups=plural))
            holder = f"each {single}"
            v //= k
        if kind in ("mul", "div"):
            pending_k = None
    sentences.append(pick(_QUESTION).format(unit=unit, h=holder))
    # the sentence each step comes from, then the question: every step's sentence is the last one
    # its iteration appended (an opening "N boxes with k each" is the first step's)
    clauses = sentences[-(len(steps) + 1) :]
    return {"question": " ".join(sentences), "answer": v, "steps": steps, "clauses": clauses}


def generate_problem(rng: random.Random, n_ops: int, max_digits: int) -> dict[str, Any]:
    """One word problem as ``{"question", "answer", "steps", "clauses"}`` (``clauses``: the sentence
    of the question each step comes from, then the question itself); deterministic given ``rng``'s
    state."""
    for _ in range(1000):
        problem = _generate_once(rng, n_ops, max_digits)
        if problem is not None:
            return problem
    raise RuntimeError("calc: could not generate a problem after 1000 attempts")  # pragma: no cover
