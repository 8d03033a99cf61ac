"""Procedural bug injection on the Python syntax tree (SWE-smith style).

Given the source text of one module, :func:`candidate_mutations` proposes small bugs, each as a
*minimal text edit*: :mod:`ast` locates a node and its exact source span, and only that span (or,
for statement-level operators, only those lines) is rewritten. The module is never re-printed with
``ast.unparse``, so comments and formatting elsewhere stay byte-identical and the fix patch is a few
lines long.

Mutations are only made inside function bodies, never in module- or class-level code, docstrings,
type annotations, default arguments, decorators or f-strings. Every candidate parses and differs
from the original; expression rewrites are additionally checked to parse to exactly the intended
tree, so operator precedence can never silently turn one bug into another.

:func:`sample_mutations` draws a deterministic sample spread over operators and functions.
The operators themselves are in :mod:`.operators`, the text edits they make in :mod:`.edits`.
"""

from __future__ import annotations

import ast
import random
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from horizonrl.envs.swe.bugs.edits import Context, Edit, Function, Proposal, Source
from horizonrl.envs.swe.bugs.operators import OPERATOR_FUNCTIONS, OPERATORS

# No candidate changes more than this many lines (counted on the larger side of the diff), so that every
# fix patch stays small.
MAX_CHANGED_LINES = 10


@dataclass(frozen=True)
class Mutation:
    """One injected bug: the whole module before and after a minimal edit."""

    operator: str  # one of OPERATORS
    path: str  # the module's path, as given
    line: int  # 1-based line of the (first) edit
    function: str | None  # qualified name of the enclosing function, e.g. "Inflector.pluralize"
    original: str  # the whole original module text
    mutated: str  # the whole mutated module text
    description: str  # what was changed; for the datasheet only, never shown to the agent


# ---------------------------------------------------------------------------------------------------
# Walking function bodies


def _is_bare_constant_statement(node: ast.AST) -> bool:
    """Docstrings and other bare constant statements (``...``): never mutated."""
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)


def _functions(tree: ast.AST) -> Iterator[tuple[str, Function]]:
    """Every function or method in source order, with its qualified name ("Class.method", "f.inner")."""

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, Function]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield prefix + child.name, child
                yield from visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.stmt | ast.excepthandler | ast.match_case):
                yield from visit(child, prefix)

    yield from visit(tree, "")


def _child_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Children of ``node`` that may be mutated: no annotations, lambda parameters/defaults, slice steps."""
    for field, value in ast.iter_fields(node):
        if field in ("annotation", "returns") or (isinstance(node, ast.Lambda) and field == "args"):
            continue
        if isinstance(node, ast.Slice) and field == "step":  # ``x[::-1]`` -> ``x[::-2]`` is too odd
            continue
        if isinstance(value, ast.AST):
            yield value
        elif isinstance(value, list):
            yield from (item for item in value if isinstance(item, ast.AST))


def _walk_body(function: Function) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(node, parent) pairs of one function body in source order.

    Nested functions and classes are skipped (they are visited as functions of their own), and so are
    f-strings (whose inner positions are unreliable before Python 3.12) and bare constant statements.
    """
    stack: list[tuple[ast.AST, ast.AST]] = [(stmt, function) for stmt in reversed(function.body)]
    while stack:
        node, parent = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.JoinedStr):
            continue
        if _is_bare_constant_statement(node):
            continue
        yield node, parent
        stack.extend((child, node) for child in reversed(list(_child_nodes(node))))


# ---------------------------------------------------------------------------------------------------
# Public API


def _apply(text: str, edits: Sequence[Edit]) -> str:
    """Apply non-overlapping edits to ``text``."""
    for edit in sorted(edits, key=lambda e: e.start, reverse=True):
        text = text[: edit.start] + edit.new + text[edit.end :]
    return text


def _first_changed_offset(text: str, edits: Sequence[Edit]) -> int:
    """Offset of the first character the edits really change."""
    offsets = []
    for edit in edits:
        old, n = text[edit.start : edit.end], 0
        while n < min(len(old), len(edit.new)) and old[n] == edit.new[n]:
            n += 1
        offsets.append(edit.start + n)
    return min(offsets)


def _parses(text: str) -> bool:
    """Whether ``text`` is a syntactically valid module."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class _Candidate:
    """A checked proposal, not yet materialized as a whole mutated module."""

    offset: int  # of the first changed character
    line: int
    function: str
    proposal: Proposal

    def mutation(self, source: str, path: str) -> Mutation:
        """The full :class:`Mutation`."""
        where = f"{self.proposal.operator} in {self.function} (line {self.line})"
        return Mutation(
            operator=self.proposal.operator,
            path=path,
            line=self.line,
            function=self.function,
            original=source,
            mutated=_apply(source, self.proposal.edits),
            description=f"{where}: {self.proposal.description}",
        )


def _proposals(tree: ast.Module, src: Source) -> Iterator[tuple[Context, Proposal]]:
    """(context, proposal) for every operator at every node of every function body."""
    for qualname, function in _functions(tree):
        region = (src.line_start(function.lineno), src.line_start(function.end_lineno + 1))  # type: ignore[operator]
        ctx = Context(src, function, qualname, region)
        for node, parent in _walk_body(function):
            for _, operator in OPERATOR_FUNCTIONS:
                for proposal in operator(node, parent, ctx):
                    yield ctx, proposal


def _checked_text(src: Source, ctx: Context, proposal: Proposal) -> str | None:
    """A key to deduplicate on, or None if the mutation changes nothing, too much, or does not parse.

    When every edit lies inside the lines of the function (the usual case), only the function is
    re-parsed: the rest of the module is untouched and already known to parse, so this keeps the cost
    linear in the module size. An indented function (a method, a nested function) is parsed as the
    body of an ``if 1:``.
    """
    start, end = ctx.region
    if all(start <= e.start <= e.end <= end for e in proposal.edits):
        shifted = [Edit(e.start - start, e.end - start, e.new) for e in proposal.edits]
        original = src.text[start:end]
        mutated = _apply(original, shifted)
        wrapper = "if 1:\n" if ctx.function.col_offset else ""
        key, parsed = f"{start}:{mutated}", wrapper + mutated
    else:
        original, mutated = src.text, _apply(src.text, proposal.edits)
        key, parsed = mutated, mutated
    if mutated == original or _changed_lines(original, mutated) > MAX_CHANGED_LINES:
        return None
    return key if _parses(parsed) else None


def _changed_lines(original: str, mutated: str) -> int:
    """How many lines differ between two texts, on the larger side, after common leading/trailing lines."""
    old, new = original.splitlines(), mutated.splitlines()
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    return max(len(old), len(new)) - head - tail


def _candidates(source: str) -> list[_Candidate]:
    """Every valid, distinct candidate, ordered by the position of its first change."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    src = Source(source)
    seen: set[str] = set()
    found: list[_Candidate] = []
    for ctx, proposal in _proposals(tree, src):
        key = _checked_text(src, ctx, proposal)
        if key is None or key in seen:
            continue
        seen.add(key)
        offset = _first_changed_offset(source, proposal.edits)
        found.append(_Candidate(offset, src.lineno_of(offset), ctx.qualname, proposal))
    found.sort(key=lambda c: c.offset)  # stable: ties keep the order of the operators
    return found


def candidate_mutations(source: str, path: str) -> list[Mutation]:
    """All candidate bugs for one module, in a deterministic order (by position of the first change).

    Returns an empty list if ``source`` does not parse. Every candidate parses, differs from the
    original and has a distinct mutated text.
    """
    return [candidate.mutation(source, path) for candidate in _candidates(source)]


def sample_mutations(source: str, path: str, k: int, seed: int) -> list[Mutation]:
    """A deterministic sample of up to ``k`` candidates, spread over operators and functions.

    Operators are visited round-robin (in an order shuffled by ``seed``); from each, the candidate
    whose function and line have been used least so far is taken (ties broken by a seeded shuffle).
    The sample for ``k`` is a prefix of the sample for ``k + 1`` with the same seed.
    """
    if k <= 0:
        return []
    rng = random.Random(seed)
    groups: dict[str, list[_Candidate]] = {}
    for candidate in _candidates(source):
        groups.setdefault(candidate.proposal.operator, []).append(candidate)
    for group in groups.values():
        rng.shuffle(group)
    order = [op for op in OPERATORS if op in groups]
    rng.shuffle(order)
    used_functions: Counter[str] = Counter()
    used_lines: Counter[tuple[str, int]] = Counter()
    picked: list[_Candidate] = []
    while len(picked) < k and any(groups.values()):
        for operator in order:
            group = groups[operator]
            if not group or len(picked) >= k:
                continue
            best = min(
                range(len(group)),
                key=lambda i, g=group: (
                    used_functions[g[i].function],
                    used_lines[(g[i].function, g[i].line)],
                    i,
                ),
            )
            candidate = group.pop(best)
            used_functions[candidate.function] += 1
            used_lines[(candidate.function, candidate.line)] += 1
            picked.append(candidate)
    return [candidate.mutation(source, path) for candidate in picked]
