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
"""

from __future__ import annotations

import ast
import bisect
import random
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

OPERATORS: tuple[str, ...] = (
    "invert_condition",
    "change_compare",
    "change_binop",
    "off_by_one",
    "remove_statement",
    "swap_arguments",
    "break_return",
    "swap_if_else",
    "change_constant",
)

# No candidate changes more than this many lines (counted on the larger side of the diff), so that every
# fix patch stays small; a removed statement spans at most MAX_REMOVED_LINES lines.
MAX_CHANGED_LINES = 10
MAX_REMOVED_LINES = 5

_NEWLINE = re.compile(r"\r\n|\r|\n")
_SPACE = r"(?:\s|\\)+"  # whitespace, possibly with backslash continuations, inside a two-word operator
_COMMENT = r"#[^\r\n]*"
_COMPARE_TOKEN = re.compile(
    rf"{_COMMENT}|(?P<op>not{_SPACE}in|is{_SPACE}not|<=|>=|==|!=|<|>|in|is)",
)
_BINOP_TOKEN = re.compile(rf"{_COMMENT}|(?P<op>\*\*|//|<<|>>|[-+*/%@&|^])")
_AUGOP_TOKEN = re.compile(rf"{_COMMENT}|(?P<op>(?:\*\*|//|<<|>>|[-+*/%@&|^])=)")
_BOOLOP_TOKEN = re.compile(rf"{_COMMENT}|(?P<op>and|or)")
_EMPTY_OR_SPACE_STR = re.compile(r"""(?P<prefix>[rRbBuU]{0,2})(?P<quote>['"])(?P<body> ?)(?P=quote)""")
_ELSE_LINE = re.compile(r"[ \t\f]*else[ \t\f]*:[ \t\f]*(?:#[^\r\n]*)?(?:\r\n|\r|\n)")
_TRAILER = re.compile(r"[ \t\f]*(?:#[^\r\n]*)?")

_COMPARE_SWAP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_COMPARE_TEXT: dict[type[ast.cmpop], str] = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
}
_BINOP_SWAP: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Add,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Mod,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
}
_BINOP_TEXT: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.MatMult: "@",
}
_BINOP_PRECEDENCE: dict[type[ast.operator], int] = {
    ast.BitOr: 1,
    ast.BitXor: 2,
    ast.BitAnd: 3,
    ast.LShift: 4,
    ast.RShift: 4,
    ast.Add: 5,
    ast.Sub: 5,
    ast.Mult: 6,
    ast.MatMult: 6,
    ast.Div: 6,
    ast.FloorDiv: 6,
    ast.Mod: 6,
    ast.Pow: 7,
}
_Function = ast.FunctionDef | ast.AsyncFunctionDef

# Calls whose positional arguments commute: swapping them is an equivalent mutant, not a bug.
_SYMMETRIC_CALLS = frozenset({"max", "min", "gcd", "lcm", "hypot", "isclose"})


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


@dataclass(frozen=True)
class _Edit:
    """Replace ``text[start:end]`` (character offsets) by ``new``."""

    start: int
    end: int
    new: str


@dataclass(frozen=True)
class _Token:
    """An operator token: its character range and its text with whitespace normalized."""

    start: int
    end: int
    text: str


@dataclass(frozen=True)
class _Proposal:
    """A mutation before it is applied and checked."""

    operator: str
    edits: tuple[_Edit, ...]
    description: str


class _Source:
    """Module text with conversions from ast positions (UTF-8 byte columns) to character offsets."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0] + [m.end() for m in _NEWLINE.finditer(text)]

    def line_start(self, lineno: int) -> int:
        """Character offset of the start of 1-based line ``lineno`` (the text length past the end)."""
        return self.starts[lineno - 1] if lineno <= len(self.starts) else len(self.text)

    def line_text(self, lineno: int) -> str:
        """The text of line ``lineno`` without its line break."""
        start = self.line_start(lineno)
        end = self.line_start(lineno + 1)
        return self.text[start:end].rstrip("\r\n")

    def lineno_of(self, offset: int) -> int:
        """1-based line containing character ``offset``."""
        return bisect.bisect_right(self.starts, offset)

    def offset(self, lineno: int, col: int) -> int:
        """Character offset of ast position (``lineno``, ``col`` in UTF-8 bytes)."""
        line = self.line_text(lineno)
        if not line.isascii():
            col = len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))
        return self.line_start(lineno) + col

    def start(self, node: ast.AST) -> int:
        """Character offset where ``node`` starts."""
        return self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        """Character offset just past the end of ``node``."""
        return self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]

    def segment(self, node: ast.AST) -> str:
        """The exact source text of ``node``."""
        return self.text[self.start(node) : self.end(node)]

    def owns_lines(self, first: ast.stmt, last: ast.stmt) -> bool:
        """Whether statements ``first``..``last`` occupy whole lines (only a comment may follow)."""
        before = self.text[self.line_start(first.lineno) : self.start(first)]
        after_start = self.end(last)
        after = self.text[after_start : self.line_start(last.end_lineno + 1)]  # type: ignore[operator]
        return not before.strip() and _TRAILER.fullmatch(after.rstrip("\r\n")) is not None

    def indent(self, stmt: ast.stmt) -> str:
        """The indentation before ``stmt`` on its first line."""
        return self.text[self.line_start(stmt.lineno) : self.start(stmt)]


@dataclass(frozen=True)
class _Context:
    """Where the operators are working: the module and the enclosing function."""

    src: _Source
    function: _Function
    qualname: str
    region: tuple[int, int]  # character range of the function's whole lines (decorators excluded)


# ---------------------------------------------------------------------------------------------------
# Walking function bodies


def _is_bare_constant_statement(node: ast.AST) -> bool:
    """Docstrings and other bare constant statements (``...``): never mutated."""
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)


def _functions(tree: ast.AST) -> Iterator[tuple[str, _Function]]:
    """Every function or method in source order, with its qualified name ("Class.method", "f.inner")."""

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, _Function]]:
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


def _walk_body(function: _Function) -> Iterator[tuple[ast.AST, ast.AST]]:
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
# Helpers shared by the operators


def _same_tree(a: ast.AST, b: ast.AST) -> bool:
    """Structural equality of two syntax trees, ignoring positions."""
    return ast.dump(a) == ast.dump(b)


def _parses_as(text: str, expected: ast.AST) -> bool:
    """Whether the expression ``text`` parses to exactly ``expected``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parsed = ast.parse(f"({text}\n)", mode="eval").body
    except (SyntaxError, ValueError):
        return False
    return _same_tree(parsed, expected)


def _short(text: str, limit: int = 60) -> str:
    """One-line abbreviation of a code snippet, for descriptions."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _token_between(src: _Source, left: ast.AST, right: ast.AST, pattern: re.Pattern[str]) -> _Token | None:
    """The operator token between two sibling nodes (skipping parentheses, spaces and comments)."""
    gap_start = src.end(left)
    for match in pattern.finditer(src.text, gap_start, src.start(right)):
        if match.group("op"):
            return _Token(match.start("op"), match.end("op"), " ".join(match.group("op").split()))
    return None


def _replace_in_node(src: _Source, node: ast.AST, replacements: Sequence[tuple[int, int, str]]) -> str:
    """The source text of ``node`` with some absolute character ranges replaced."""
    start, end = src.start(node), src.end(node)
    pieces, cursor = [], start
    for lo, hi, new in sorted(replacements):
        pieces += [src.text[cursor:lo], new]
        cursor = hi
    pieces.append(src.text[cursor:end])
    return "".join(pieces)


def _is_parenthesized(src: _Source, node: ast.AST) -> bool:
    """Whether ``node`` is directly enclosed in parentheses (of a group or a call) in the source."""
    before = src.text[: src.start(node)].rstrip()
    after = src.text[src.end(node) :].lstrip()
    return before.endswith("(") and after.startswith(")")


def _isolated(src: _Source, node: ast.AST, parent: ast.AST) -> bool:
    """Whether nothing around ``node`` can bind more tightly than any expression would."""
    if isinstance(parent, ast.stmt | ast.keyword | ast.List | ast.Tuple | ast.Set | ast.Dict | ast.Lambda):
        return True
    if isinstance(parent, ast.Call) and node is not parent.func:
        return True
    if isinstance(parent, ast.Subscript) and node is parent.slice:
        return True
    return _is_parenthesized(src, node)


def _expr_edit(
    ctx: _Context, node: ast.AST, new: str, expected: ast.AST, *, parent: ast.AST | None = None
) -> _Edit | None:
    """Replace the span of ``node`` by ``new`` if that parses to ``expected``.

    With ``parent`` given, ``new`` binds more loosely than the original, so it is parenthesized
    unless the surroundings make that unnecessary.
    """
    if not _parses_as(new, expected):
        return None
    if parent is not None and not _isolated(ctx.src, node, parent):
        new = f"({new})"
    return _Edit(ctx.src.start(node), ctx.src.end(node), new)


def _proposal(operator: str, edit: _Edit | None, description: str) -> Iterator[_Proposal]:
    """Zero or one proposal, depending on whether the edit could be made."""
    if edit is not None:
        yield _Proposal(operator, (edit,), description)


def _is_str(node: ast.AST) -> bool:
    """Whether ``node`` is obviously a string (a str/bytes literal or an f-string)."""
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str | bytes)
    )


def _is_int(node: ast.AST) -> bool:
    """An int literal (not a bool)."""
    return isinstance(node, ast.Constant) and type(node.value) is int


def _is_simple(node: ast.AST) -> bool:
    """Names, literals and dotted attribute chains: safe to move around."""
    if isinstance(node, ast.Attribute):
        return _is_simple(node.value) and not isinstance(node.value, ast.Constant)
    return isinstance(node, ast.Name | ast.Constant)


def _is_negative_literal(node: ast.AST) -> bool:
    """``-1`` and the like: handled as int literals, not as computed bounds."""
    return isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant)


def _format_int(value: int, like: str) -> str:
    """``value`` written in the same base as the literal ``like``."""
    prefix = like[:2].lower()
    if prefix == "0x":
        return hex(value)
    if prefix == "0o":
        return oct(value)
    if prefix == "0b":
        return bin(value)
    return str(value)


def _block_of(stmt: ast.stmt, parent: ast.AST) -> list[ast.stmt]:
    """The statement list of ``parent`` that contains ``stmt``."""
    for field in ("body", "orelse", "finalbody"):
        block = getattr(parent, field, None)
        if isinstance(block, list) and any(item is stmt for item in block):
            return block
    return []


def _whole_lines(src: _Source, first: ast.stmt, last: ast.stmt) -> tuple[int, int]:
    """Character range of the full lines holding statements ``first``..``last``, line breaks included."""
    return src.line_start(first.lineno), src.line_start(last.end_lineno + 1)  # type: ignore[operator]


def _first_parameter(function: _Function) -> str | None:
    """The first positional parameter other than ``self``/``cls``."""
    names = [a.arg for a in function.args.posonlyargs + function.args.args]
    return next((name for name in names if name not in ("self", "cls")), None)


# ---------------------------------------------------------------------------------------------------
# Operators: each takes (node, parent, context) and yields proposals


def _invert_condition(node: ast.AST, parent: ast.AST, ctx: _Context) -> Iterator[_Proposal]:
    """Negate the test of an if/elif/while/ternary/comprehension filter, or drop its top-level ``not``."""
    if isinstance(node, ast.If | ast.While | ast.IfExp):
        tests = [node.test]
    elif isinstance(node, ast.comprehension):
        tests = list(node.ifs)
    else:
        return
    for test in tests:
        if isinstance(test, ast.Constant):
            continue
        text = ctx.src.segment(test)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and text.startswith("not"):
            new, expected = text[3:].lstrip(), test.operand
        else:
            loose = isinstance(test, ast.BoolOp | ast.IfExp | ast.Lambda | ast.NamedExpr)
            new = f"not ({text})" if loose else f"not {text}"
            expected = ast.UnaryOp(ast.Not(), test)
        yield from _proposal(
            "invert_condition",
            _expr_edit(ctx, test, new, expected),
            f"inverted the condition `{_short(text)}` to `{_short(new)}`",
        )


def _change_compare(node: ast.AST, parent: ast.AST, ctx: _Context) -> Iterator[_Proposal]:
    """Swap one comparison operator of a comparison chain."""
    if not isinstance(node, ast.Compare):
        return
    for i, op in enumerate(node.ops):
        left = node.left if i == 0 else node.comparators[i - 1]
        token = _token_between(ctx.src, left, node.comparators[i], _COMPARE_TOKEN)
        new_op = _COMPARE_SWAP[type(op)]
        if token is None or token.text != _COMPARE_TEXT[type(op)]:
            continue
        new_text = _COMPARE_TEXT[new_op]
        new = _replace_in_node(ctx.src, node, [(token.start, token.end, new_text)])
        ops = [*node.ops[:i], new_op(), *node.ops[i + 1 :]]
        expected = ast.Compare(node.left, ops, node.comparators)
        yield from _proposal(
            "change_compare",
            _expr_edit(ctx, node, new, expected),
            f"changed `{_COMPARE_TEXT[type(op)]}` to `{new_text}` in `{_short(ctx.src.segment(node))}`",
        )


def _change_binop(node: ast.AST, parent: ast.AST, ctx: _Context) -> Iterator[_Proposal]:
    """Swap an arithmetic/bitwise operator (also in augmented assignments), or ``and``/``or``."""
    if isinstance(node, ast.BinOp):
        yield from _change_arithmetic(node, parent, ctx)
    elif isinstance(node, ast.AugAssign):
        yield from _change_augmented(node, ctx)
    elif isinstance(node, ast.BoolOp):
        yield from _change_boolean(node, parent, ctx)


def _string_like_operation(op: ast.operator, left: ast.AST, right: ast.AST) -> bool:
    """Concatenation, repetition or %-formatting of literal strings: not arithmetic at all."""
    if isinstance(op, ast.Mod):
        return _is_str(left)
    return isinstance(op, ast.Add | ast.Mult) and (_is_str(left) or _is_str(right))


def _change_arithmetic(node: ast.BinOp, parent: ast.AST, ctx: _Context) -> Iterator[_Proposal]:
    """``a + b`` -> ``a - b`` and the like (see ``_BINOP_SWAP``)."""
    new_op = _BINOP_SWAP.get(type(node.op))
    if new_op is None or _string_like_operation(node.op, node.left, node.right):
        return
    token = _token_between(ctx.src, node.left, node.right, _BINOP_TOKEN)
    if token is None or token.text != _BINOP_TEXT[type(node.op)]:
        return
    new = _replace_in_node(ctx.src, node, [(token.start, token.end, _BINOP_TEXT[new_op])])
    looser = _BINOP_PRECEDENCE[new_op] < _BINOP_PRECEDENCE[type(node.op)]
    edit = _expr_edit(
        ctx, node, new, ast.BinOp(node.left, new_op(), node.right), parent=parent if looser else None
    )
    old_text, new_text = _BINOP_TEXT[type(node.op)], _BINOP_TEXT[new_op]
    yield from _proposal(
        "change_binop", edit, f"changed `{old_text}` to `{new_text}` in `{_short(ctx.src.segment(node))}`"
    )


def _change_augmented(node: ast.AugAssign, ctx: _Context) -> Iterator[_Proposal]:
    """``x += y`` -> ``x -= y`` and the like."""
    new_op = _BINOP_SWAP.get(type(node.op))
    if new_op is None or _string_like_operation(node.op, node.target, node.value):
        return
    token = _token_between(ctx.src, node.target, node.value, _AUGOP_TOKEN)
    if token is None or token.text != _BINOP_TEXT[type(node.op)] + "=":
        return
    new_text = _BINOP_TEXT[new_op] + "="
    edit = _Edit(token.start, token.end, new_text)
    yield _Proposal("change_binop", (edit,), f"changed `{token.text}` to `{new_text}`")


def _change_boolean(node: ast.BoolOp, parent: ast.AST, ctx: _Context) -> Iterator[_Proposal]:
    """``a and b`` -> ``a or b`` and back (every operator of the chain)."""
    new_op: ast.boolop = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    old_text, new_text = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
    replacements = []
    for left, right in zip(node.values, node.values[1:], strict=False):
        token = _token_between(ctx.src, left, right, _BOOLOP_TOKEN)
        if token is None or token.text != old_text:
            return
        replacements.append((token.start, token.end, new_text))
    new = _replace_in_node(ctx.src, node, replacements)
    looser = isinstance(new_op, ast.Or)
    edit = _expr_edit(ctx, node, new, ast.BoolOp(new_op, node.values), parent=parent if looser else None)
    yield from _proposal(
        "change_binop", edit, f"changed `{old_text}` to `{new_text}` in `{_short(ctx.src.segment(node))}`"
    )


def _off_by_one(node: ast.AST, parent: ast.AST, ctx: _Context) -> Iterator[_Proposal]:
    """An int literal n -> n+1 / n-1 (never negative); a computed slice bound ``x[:n]`` -> ``x[:n + 1]``."""
    if _is_int(node):
        text = ctx.src.segment(node)
        negated = isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.USub)
        for value in (node.value + 1, node.value - 1):
            if value < 0 or (value == 0 and negated):  # no ``-0``
                continue
            new = _format_int(value, text)
            yield from _proposal(
                "off_by_one",
                _expr_edit(ctx, node, new, ast.Constant(value)),
                f"changed the integer `{text}` to `{new}`",
            )
    elif isinstance(node, ast.Slice):
        for bound in (node.lower, node.upper):
            if bound is None or isinstance(bound, ast.Constant) or _is_negative_literal(bound):
                continue
            text = ctx.src.segment(bound)
            new = f"{text} + 1"
            expected = ast.BinOp(bound, ast.Add(), ast.Constant(1))
            yield from _proposal(
                "off_by_one",
                _expr_edit(ctx, bound, new, expected),
                f"changed the slice bound `{_short(text)}` to `{_short(new)}`",
            )


_REMOVABLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Continue, ast.Break)


def _removable(node: ast.AST) -> bool:
    """Simple statements whose removal is a plausible bug: assignments, calls, continue/break."""
    if isinstance(node, ast.AnnAssign):
        return node.value is not None
    if isinstance(node, ast.Expr):
        value = node.value.value if isinstance(node.value, ast.Await) else node.value
        return isinstance(value, ast.Call)
    return isinstance(node, _REMOVABLE)


def _remove_statement(node: ast.AST, parent: ast.AST, ctx: _Context) -> Iterator[_Proposal]:
    """Delete one simple statement (its lines), or replace it by ``pass`` where it is needed."""
    if not isinstance(node, ast.stmt) or not _removable(node):
        return
    if node.end_lineno - node.lineno + 1 > MAX_REMOVED_LINES:  # type: ignore[operator]
        return
    src, block = ctx.src, _block_of(node, parent)
    description = f"removed the statement `{_short(src.segment(node))}`"
    if len(block) > 1 and src.owns_lines(node, node):
        start, end = _whole_lines(src, node, node)
        yield _Proposal("remove_statement", (_Edit(start, end, ""),), description)
    else:
        yield _Proposal("remove_statement", (_Edit(src.start(node), src.end(node), "pass"),), description)


def _swap_arguments(node: ast.AST, parent: ast.AST, ctx: _Context) -> Iterator[_Proposal]:
    """Swap two adjacent positional arguments of a call when both are simple and different."""
    if not isinstance(node, ast.Call):
        return
    if isinstance(node.func, ast.Name) and node.func.id in _SYMMETRIC_CALLS:
        return
    for first, second in zip(node.args, node.args[1:], strict=False):
        if not (_is_simple(first) and _is_simple(second)) or _same_tree(first, second):
            continue
        a, b = ctx.src.segment(first), ctx.src.segment(second)
        edits = (
            _Edit(ctx.src.start(first), ctx.src.end(first), b),
            _Edit(ctx.src.start(second), ctx.src.end(second), a),
        )
        yield _Proposal(
            "swap_arguments", edits, f"swapped the arguments `{_short(a)}` and `{_short(b)}` of a call"
        )


def _break_return(node: ast.AST, parent: ast.AST, ctx: _Context) -> Iterator[_Proposal]:
    """``return <expr>`` -> ``return None``, or -> ``return <first parameter>``."""
    if not isinstance(node, ast.Return) or node.value is None:
        return
    value = node.value
    if isinstance(value, ast.Constant) and value.value is None:
        return
    text = ctx.src.segment(value)
    replacements = ["None"]
    parameter = _first_parameter(ctx.function)
    if parameter is not None and not (isinstance(value, ast.Name) and value.id == parameter):
        replacements.append(parameter)
    for new in replacements:
        yield _Proposal(
            "break_return",
            (_Edit(ctx.src.start(value), ctx.src.end(value), new),),
            f"changed `return {_short(text)}` to `return {new}`",
        )


def _swap_if_else(node: ast.AST, parent: ast.AST, ctx: _Context) -> Iterator[_Proposal]:
    """Swap the bodies of an if/else (not if/elif), when both are small whole-line blocks.

    Only the ``else:`` line may separate the two blocks, so the patch is just the moved lines.
    """
    if not isinstance(node, ast.If) or not node.orelse:
        return
    src, body, orelse = ctx.src, node.body, node.orelse
    if (
        len(orelse) == 1
        and isinstance(orelse[0], ast.If)
        and src.line_text(orelse[0].lineno).lstrip().startswith("elif")
    ):
        return
    if src.indent(body[0]) != src.indent(orelse[0]):
        return
    if not (src.owns_lines(body[0], body[-1]) and src.owns_lines(orelse[0], orelse[-1])):
        return
    b0, b1 = _whole_lines(src, body[0], body[-1])
    e0, e1 = _whole_lines(src, orelse[0], orelse[-1])
    body_text, else_text = src.text[b0:b1], src.text[e0:e1]
    if _ELSE_LINE.fullmatch(src.text, b1, e0) is None or not else_text.endswith(("\n", "\r")):
        return
    edits = (_Edit(b0, b1, else_text), _Edit(e0, e1, body_text))
    yield _Proposal(
        "swap_if_else", edits, f"swapped the if and else bodies of `if {_short(src.segment(node.test))}`"
    )


def _change_constant(node: ast.AST, parent: ast.AST, ctx: _Context) -> Iterator[_Proposal]:
    """``True`` <-> ``False``; an empty string literal <-> a single space."""
    if not isinstance(node, ast.Constant):
        return
    text = ctx.src.segment(node)
    if isinstance(node.value, bool) and text in ("True", "False"):
        new, value = ("False", False) if node.value else ("True", True)
        yield from _proposal(
            "change_constant", _expr_edit(ctx, node, new, ast.Constant(value)), f"changed `{text}` to `{new}`"
        )
        return
    match = _EMPTY_OR_SPACE_STR.fullmatch(text)
    if match is None or not isinstance(node.value, str | bytes):
        return
    prefix, quote = match.group("prefix"), match.group("quote")
    new = prefix + quote + ("" if match.group("body") else " ") + quote
    value: str | bytes = " " if node.value in ("", b"") else ""
    if isinstance(node.value, bytes):
        value = value.encode()
    yield from _proposal(
        "change_constant", _expr_edit(ctx, node, new, ast.Constant(value)), f"changed `{text}` to `{new}`"
    )


_OPERATOR_FUNCTIONS: tuple[tuple[str, Callable[[ast.AST, ast.AST, _Context], Iterator[_Proposal]]], ...] = (
    ("invert_condition", _invert_condition),
    ("change_compare", _change_compare),
    ("change_binop", _change_binop),
    ("off_by_one", _off_by_one),
    ("remove_statement", _remove_statement),
    ("swap_arguments", _swap_arguments),
    ("break_return", _break_return),
    ("swap_if_else", _swap_if_else),
    ("change_constant", _change_constant),
)
assert tuple(name for name, _ in _OPERATOR_FUNCTIONS) == OPERATORS


# ---------------------------------------------------------------------------------------------------
# Public API


def _apply(text: str, edits: Sequence[_Edit]) -> str:
    """Apply non-overlapping edits to ``text``."""
    for edit in sorted(edits, key=lambda e: e.start, reverse=True):
        text = text[: edit.start] + edit.new + text[edit.end :]
    return text


def _first_changed_offset(text: str, edits: Sequence[_Edit]) -> int:
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
    proposal: _Proposal

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


def _proposals(tree: ast.Module, src: _Source) -> Iterator[tuple[_Context, _Proposal]]:
    """(context, proposal) for every operator at every node of every function body."""
    for qualname, function in _functions(tree):
        region = (src.line_start(function.lineno), src.line_start(function.end_lineno + 1))  # type: ignore[operator]
        ctx = _Context(src, function, qualname, region)
        for node, parent in _walk_body(function):
            for _, operator in _OPERATOR_FUNCTIONS:
                for proposal in operator(node, parent, ctx):
                    yield ctx, proposal


def _checked_text(src: _Source, ctx: _Context, proposal: _Proposal) -> str | None:
    """A key to deduplicate on, or None if the mutation changes nothing, too much, or does not parse.

    When every edit lies inside the lines of the function (the usual case), only the function is
    re-parsed: the rest of the module is untouched and already known to parse, so this keeps the cost
    linear in the module size. An indented function (a method, a nested function) is parsed as the
    body of an ``if 1:``.
    """
    start, end = ctx.region
    if all(start <= e.start <= e.end <= end for e in proposal.edits):
        shifted = [_Edit(e.start - start, e.end - start, e.new) for e in proposal.edits]
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
    src = _Source(source)
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
