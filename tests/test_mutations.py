"""Tests of horizonrl.envs.swe.bugs.mutations: minimal-edit bug injection on small hand-written modules
and stdlib."""

from __future__ import annotations

import ast
import difflib
import inspect
import shlex
import textwrap

import pytest

from horizonrl.envs.swe.bugs.mutations import Mutation, candidate_mutations, sample_mutations
from horizonrl.envs.swe.bugs.operators import OPERATORS


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def diff(mutation: Mutation) -> tuple[list[tuple[int, str]], list[str]]:
    """(removed (1-based original line number, text) pairs, added lines) between original and mutated.

    Common leading and trailing lines are skipped first so that difflib only compares the edited region.
    """
    old, new = mutation.original.splitlines(), mutation.mutated.splitlines()
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    old_mid, new_mid = old[head : len(old) - tail], new[head : len(new) - tail]
    removed: list[tuple[int, str]] = []
    added: list[str] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old_mid, new_mid, autojunk=False).get_opcodes():
        if tag != "equal":
            removed += [(head + i + 1, old_mid[i]) for i in range(i1, i2)]
            added += new_mid[j1:j2]
    return removed, added


def first_changed_line(mutation: Mutation) -> int:
    """1-based number of the first line that differs between original and mutated."""
    old, new = mutation.original.splitlines(), mutation.mutated.splitlines()
    return next(i for i, (a, b) in enumerate(zip(old, new + [""] * len(old), strict=False), 1) if a != b)


def of(mutations: list[Mutation], operator: str) -> list[Mutation]:
    return [m for m in mutations if m.operator == operator]


def find(source: str, operator: str, old: str, new: str | None) -> Mutation:
    """The unique candidate of ``operator`` that turns the line ``old`` into ``new`` (None: deletes it).

    Asserts that exactly that one line changed and the rest of the module is byte-identical.
    """
    expected_added = [] if new is None else [new]
    hits = []
    for m in of(candidate_mutations(source, "mod.py"), operator):
        removed, added = diff(m)
        if [text for _, text in removed] == [old] and added == expected_added:
            hits.append(m)
    assert len(hits) == 1, f"no unique {operator} candidate {old!r} -> {new!r}"
    m = hits[0]
    index = source.splitlines().index(old)
    assert m.line == index + 1
    lines = source.splitlines(keepends=True)
    assert m.mutated == "".join([*lines[:index], *([] if new is None else [new + "\n"]), *lines[index + 1 :]])
    assert m.original == source
    assert m.path == "mod.py"
    return m


def mutated_lines(source: str, operator: str) -> list[tuple[list[str], list[str]]]:
    return [
        ([text for _, text in removed], added)
        for removed, added in map(diff, of(candidate_mutations(source, "mod.py"), operator))
    ]


# ---------------------------------------------------------------------------------------------------
# One operator at a time


def test_invert_condition():
    src = dedent(
        """
        def f(x, items, a, b):
            if x > 0:
                x = x - 1
            while not items:
                items.append(x)
            if a and b:
                pass
            elif (
                a
            ):
                pass
            y = [i for i in items if i]
            return x if x else y
        """
    )
    m = find(src, "invert_condition", "    if x > 0:", "    if not x > 0:")
    assert m.function == "f"
    assert "x > 0" in m.description
    find(src, "invert_condition", "    while not items:", "    while items:")
    find(src, "invert_condition", "    if a and b:", "    if not (a and b):")
    find(src, "invert_condition", "        a", "        not a")
    find(src, "invert_condition", "    y = [i for i in items if i]", "    y = [i for i in items if not i]")
    find(src, "invert_condition", "    return x if x else y", "    return x if not x else y")


def test_change_compare():
    src = dedent(
        """
        def f(a, b, c, d, v):
            if a < b <= c:
                return k not in d
            return v is not None or a == b or a >= c
        """
    )
    find(src, "change_compare", "    if a < b <= c:", "    if a <= b <= c:")
    find(src, "change_compare", "    if a < b <= c:", "    if a < b < c:")
    find(src, "change_compare", "        return k not in d", "        return k in d")
    line = "    return v is not None or a == b or a >= c"
    find(src, "change_compare", line, "    return v is None or a == b or a >= c")
    find(src, "change_compare", line, "    return v is not None or a != b or a >= c")
    find(src, "change_compare", line, "    return v is not None or a == b or a > c")


def test_change_binop_keeps_precedence():
    src = dedent(
        """
        def f(a, b, c, total, step, name):
            x = a + b * c
            total += step
            ok = a and b or c
            label = "%s!" % name + "x"
            return x // 2
        """
    )
    find(src, "change_binop", "    x = a + b * c", "    x = a - b * c")
    find(src, "change_binop", "    x = a + b * c", "    x = a + (b + c)")
    find(src, "change_binop", "    total += step", "    total -= step")
    find(src, "change_binop", "    ok = a and b or c", "    ok = (a or b) or c")
    find(src, "change_binop", "    return x // 2", "    return x % 2")
    # `or` -> `and` would regroup `a and b`: that candidate is dropped; string operations are left alone.
    lines = mutated_lines(src, "change_binop")
    assert (["    ok = a and b or c"], ["    ok = a and b and c"]) not in lines
    assert not [added for removed, added in lines if "label" in removed[0]]


def test_off_by_one():
    src = dedent(
        """
        def f(items, n):
            head = items[1:n]
            tail = items[::-1]
            mask = 0x10
            return items[-1]
        """
    )
    find(src, "off_by_one", "    head = items[1:n]", "    head = items[2:n]")
    find(src, "off_by_one", "    head = items[1:n]", "    head = items[0:n]")
    find(src, "off_by_one", "    head = items[1:n]", "    head = items[1:n + 1]")
    find(src, "off_by_one", "    mask = 0x10", "    mask = 0x11")
    find(src, "off_by_one", "    mask = 0x10", "    mask = 0xf")
    find(src, "off_by_one", "    return items[-1]", "    return items[-2]")
    lines = mutated_lines(src, "off_by_one")
    assert not [added for removed, added in lines if "tail" in removed[0]]  # slice steps are left alone
    assert (["    return items[-1]"], ["    return items[-0]"]) not in lines


def test_remove_statement():
    src = dedent(
        """
        def f(a):
            a.append(1)
            b = 2
            for x in a:
                if x:
                    continue
            if b: b = 3
            c = [
                1,
                2,
                3,
                4,
                5,
            ]
            return b, c
        """
    )
    m = find(src, "remove_statement", "    a.append(1)", None)
    assert m.mutated == src.replace("    a.append(1)\n", "")
    find(src, "remove_statement", "    b = 2", None)
    find(src, "remove_statement", "            continue", "            pass")
    find(src, "remove_statement", "    if b: b = 3", "    if b: pass")
    lines = mutated_lines(src, "remove_statement")
    assert len(lines) == 4  # the 8-line list assignment is too long to remove
    assert not of(candidate_mutations(src, "mod.py"), "remove_statement")[0].mutated.count("a.append")


def test_swap_arguments():
    src = dedent(
        """
        def f(base, exp, a, b):
            x = pow(base, exp)
            y = max(a, b)
            z = divmod(a, a)
            w = divmod(len(a), b)
            return divmod(self.x, "s")
        """
    )
    find(src, "swap_arguments", "    x = pow(base, exp)", "    x = pow(exp, base)")
    find(src, "swap_arguments", '    return divmod(self.x, "s")', '    return divmod("s", self.x)')
    assert len(mutated_lines(src, "swap_arguments")) == 2


def test_break_return():
    src = dedent(
        """
        def h(value, other):
            if other:
                return value
            return value + other


        class Box:
            def get(self, item):
                return self.items[item]
        """
    )
    find(src, "break_return", "        return value", "        return None")
    find(src, "break_return", "    return value + other", "    return None")
    find(src, "break_return", "    return value + other", "    return value")
    m = find(src, "break_return", "        return self.items[item]", "        return item")
    assert m.function == "Box.get"
    assert len(mutated_lines(src, "break_return")) == 5


def test_swap_if_else():
    src = dedent(
        """
        def f(x):
            if x:
                a = 1
            else:  # the other case
                a = 2
            if x > 1:
                b = 1
            elif x:
                b = 2
            else:
                b = 3
            if x:
                c = 1
            # a comment between the bodies
            else:
                c = 2
            return a, b, c
        """
    )
    candidates = of(candidate_mutations(src, "mod.py"), "swap_if_else")
    assert len(candidates) == 2  # not the if/elif, not across the comment
    first = next(m for m in candidates if m.line == 3)
    assert first.mutated == src.replace(
        "a = 1\n    else:  # the other case\n        a = 2",
        "a = 2\n    else:  # the other case\n        a = 1",
    )
    second = next(m for m in candidates if m.line != 3)  # the elif's own if/else
    assert second.line == 9
    assert second.mutated == src.replace("b = 2\n    else:\n        b = 3", "b = 3\n    else:\n        b = 2")


def test_swap_if_else_skips_long_bodies():
    body = "".join(f"        a{i} = {i}\n" for i in range(5))
    src = f"def f(x):\n    if x:\n{body}    else:\n{body.replace('= ', '= -')}    return x\n"
    assert not of(candidate_mutations(src, "mod.py"), "swap_if_else")  # 11 changed lines
    shorter = src.replace("        a4 = 4\n", "")
    assert len(of(candidate_mutations(shorter, "mod.py"), "swap_if_else")) == 1


def test_change_constant():
    src = dedent(
        """
        def f(parts, data):
            '''Docstring: True, "".'''
            flag = True
            sep = ""
            ok = data == b''
            "a bare string, False"
            return " ".join(parts), flag
        """
    )
    find(src, "change_constant", "    flag = True", "    flag = False")
    find(src, "change_constant", '    sep = ""', '    sep = " "')
    find(src, "change_constant", "    ok = data == b''", "    ok = data == b' '")
    find(src, "change_constant", '    return " ".join(parts), flag', '    return "".join(parts), flag')
    assert len(mutated_lines(src, "change_constant")) == 4


# ---------------------------------------------------------------------------------------------------
# What must never be mutated


def test_docstrings_annotations_defaults_decorators_and_module_code_are_never_mutated():
    src = dedent(
        '''
        """Module docstring with x < 1 and True and 2 + 3."""
        import os

        LIMIT = 10 + 1 if os.sep == "/" else 2
        if LIMIT > 3:
            LIMIT = LIMIT - 1


        def deco(n=1):
            return lambda f: f


        class Box:
            """Docstring: return x + 1 if a < b else True."""

            size: int = 3 * 2
            flag = True

            @deco(n=5 + 1)
            def method(self, a: int = 1 + 2, b: "int | None" = None, *, c: bool = True) -> "dict[str, int]":
                """If a < b: return a - b, True, ""."""
                total: list[int] = [a]
                g = lambda x=3, *, y=True: x + 1
                return total
        '''
    )
    lines = src.splitlines()
    allowed = {lines.index("    return lambda f: f") + 1} | {
        lines.index(text) + 1
        for text in (
            "        total: list[int] = [a]",
            "        g = lambda x=3, *, y=True: x + 1",
            "        return total",
        )
    }
    mutations = candidate_mutations(src, "mod.py")
    assert mutations
    for m in mutations:
        removed, added = diff(m)
        assert {n for n, _ in removed} <= allowed, m.description
        for line in added:
            if "total" in line and "=" in line:
                assert line.startswith("        total: list[int] = "), m.description
            if "lambda x" in line:
                assert line.startswith("        g = lambda x=3, *, y=True: "), m.description
    assert {m.function for m in mutations} == {"deco", "Box.method"}
    # The lambda body is mutated, its defaults are not.
    assert ["        g = lambda x=3, *, y=True: x + 2"] in [diff(m)[1] for m in mutations]


def test_nested_functions_get_their_own_qualified_name():
    src = dedent(
        """
        def outer(a):
            def inner(b):
                return b + 1

            return inner(a) - 1
        """
    )
    by_line = {(m.line, m.function) for m in candidate_mutations(src, "mod.py")}
    assert (3, "outer.inner") in by_line
    assert (5, "outer") in by_line
    assert not [f for line, f in by_line if line == 3 and f == "outer"]


# ---------------------------------------------------------------------------------------------------
# Text handling


def test_non_ascii_text_on_a_mutated_line():
    src = dedent(
        """
        # -*- coding: utf-8 -*- ünïcödé comment
        def greet(name):
            return "héllo wörld 😀 " + name if len(name) > 3 else "ñ€"
        """
    )
    old = '    return "héllo wörld 😀 " + name if len(name) > 3 else "ñ€"'
    find(src, "change_compare", old, '    return "héllo wörld 😀 " + name if len(name) >= 3 else "ñ€"')
    find(src, "off_by_one", old, '    return "héllo wörld 😀 " + name if len(name) > 4 else "ñ€"')
    find(src, "invert_condition", old, '    return "héllo wörld 😀 " + name if not len(name) > 3 else "ñ€"')
    find(src, "break_return", old, "    return None")
    for m in candidate_mutations(src, "mod.py"):
        assert "ünïcödé" in m.mutated


def test_crlf_line_endings_and_tabs_are_preserved():
    src = "def f(x):\r\n\tif x:\r\n\t\ty = 1\r\n\telse:\r\n\t\ty = 2\r\n\treturn y  # ok\r\n"
    mutations = candidate_mutations(src, "mod.py")
    assert {m.operator for m in mutations} >= {
        "invert_condition",
        "swap_if_else",
        "off_by_one",
        "break_return",
    }
    for m in mutations:
        assert m.mutated.count("\n") == m.mutated.count("\r\n")
        assert "\t" in m.mutated
    swap = of(mutations, "swap_if_else")[0]
    assert swap.mutated == src.replace("y = 1\r\n\telse:\r\n\t\ty = 2", "y = 2\r\n\telse:\r\n\t\ty = 1")


def test_invalid_source_gives_no_candidates():
    assert candidate_mutations("def f(:\n    pass\n", "bad.py") == []
    assert candidate_mutations("X = 1\n", "consts.py") == []


# ---------------------------------------------------------------------------------------------------
# Invariants, determinism and sampling

SAMPLE_MODULE = dedent(
    """
    import re


    class Inflector:
        def pluralize(self, word, count=2):
            if count > 1 and not word.endswith("s"):
                word = word + "s"
            else:
                word = word
            return word

        def title(self, text):
            parts = text.split(" ")
            return " ".join(p[:1].upper() + p[1:] for p in parts if p)


    def clamp(value, low, high):
        while value < low:
            value += 1
        if value > high:
            return high
        return max(low, min(value, high))


    def search(pattern, text):
        found = re.search(pattern, text)
        return found is not None and found.start() == 0 or False
    """
)


def test_all_operators_occur_and_candidates_are_valid():
    mutations = candidate_mutations(SAMPLE_MODULE, "inflect.py")
    assert {m.operator for m in mutations} == set(OPERATORS)
    assert len({m.mutated for m in mutations}) == len(mutations)
    for m in mutations:
        ast.parse(m.mutated)
        assert m.mutated != m.original
        assert m.function in {"Inflector.pluralize", "Inflector.title", "clamp", "search"}
        assert m.description


def test_candidates_are_deterministic():
    first = candidate_mutations(SAMPLE_MODULE, "inflect.py")
    assert first == candidate_mutations(SAMPLE_MODULE, "inflect.py")
    assert [m.line for m in first] == sorted(m.line for m in first)  # source order
    assert all(m.line == first_changed_line(m) for m in first)


def test_sample_is_deterministic_and_spread():
    k = len(OPERATORS)
    sample = sample_mutations(SAMPLE_MODULE, "inflect.py", k, seed=7)
    assert sample == sample_mutations(SAMPLE_MODULE, "inflect.py", k, seed=7)
    assert len(sample) == k
    assert {m.operator for m in sample} == set(OPERATORS)  # one per operator
    assert len({m.function for m in sample}) == 4  # every function is used
    assert len({m.mutated for m in sample}) == k
    seeds = {
        tuple(m.mutated for m in sample_mutations(SAMPLE_MODULE, "inflect.py", k, seed=s)) for s in range(5)
    }
    assert len(seeds) > 1
    # Growing k extends the sample; asking for too many gives every candidate once.
    assert sample_mutations(SAMPLE_MODULE, "inflect.py", k + 5, seed=7)[:k] == sample
    everything = candidate_mutations(SAMPLE_MODULE, "inflect.py")
    big = sample_mutations(SAMPLE_MODULE, "inflect.py", 10_000, seed=1)
    assert sorted(m.mutated for m in big) == sorted(m.mutated for m in everything)
    assert sample_mutations(SAMPLE_MODULE, "inflect.py", 0, seed=1) == []


@pytest.mark.parametrize("module", [textwrap, shlex], ids=lambda m: m.__name__)
def test_stdlib_module(module):
    source = inspect.getsource(module)
    mutations = candidate_mutations(source, f"{module.__name__}.py")
    assert len(mutations) > 150
    assert {m.operator for m in mutations} == set(OPERATORS)
    for m in mutations:
        ast.parse(m.mutated)
        removed, added = diff(m)
        assert 1 <= max(len(removed), len(added)) <= 10, m.description
        # The first changed line (an identical line right after a removed one can hide it from the diff).
        assert m.line <= first_changed_line(m) <= m.line + 1, m.description
    assert len(sample_mutations(source, "m.py", 20, seed=0)) == 20
