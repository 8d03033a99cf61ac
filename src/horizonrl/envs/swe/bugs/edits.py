"""Minimal text edits on a module's source, for the mutation operators (:mod:`.operators`).

:class:`Source` turns :mod:`ast` positions (UTF-8 byte columns) into character offsets, an
:class:`Edit` replaces one character range, a :class:`Proposal` is one operator's edits before they
are applied and checked, and a :class:`Context` is where the operators work (the module and the
enclosing function). The helpers below find operator tokens between nodes and make expression
rewrites that are checked to parse to exactly the intended tree.
"""

from __future__ import annotations

import ast
import bisect
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

_NEWLINE = re.compile(r"\r\n|\r|\n")
_TRAILER = re.compile(r"[ \t\f]*(?:#[^\r\n]*)?")

Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Edit:
    """Replace ``text[start:end]`` (character offsets) by ``new``."""

    start: int
    end: int
    new: str


@dataclass(frozen=True)
class Token:
    """An operator token: its character range and its text with whitespace normalized."""

    start: int
    end: int
    text: str


@dataclass(frozen=True)
class Proposal:
    """A mutation before it is applied and checked."""

    operator: str
    edits: tuple[Edit, ...]
    description: str


class Source:
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
class Context:
    """Where the operators are working: the module and the enclosing function."""

    src: Source
    function: Function
    qualname: str
    region: tuple[int, int]  # character range of the function's whole lines (decorators excluded)


# ---------------------------------------------------------------------------------------------------
# Helpers shared by the operators


def same_tree(a: ast.AST, b: ast.AST) -> bool:
    """Structural equality of two syntax trees, ignoring positions."""
    return ast.dump(a) == ast.dump(b)


def parses_as(text: str, expected: ast.AST) -> bool:
    """Whether the expression ``text`` parses to exactly ``expected``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parsed = ast.parse(f"({text}\n)", mode="eval").body
    except (SyntaxError, ValueError):
        return False
    return same_tree(parsed, expected)


def short(text: str, limit: int = 60) -> str:
    """One-line abbreviation of a code snippet, for descriptions."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def token_between(src: Source, left: ast.AST, right: ast.AST, pattern: re.Pattern[str]) -> Token | None:
    """The operator token between two sibling nodes (skipping parentheses, spaces and comments)."""
    gap_start = src.end(left)
    for match in pattern.finditer(src.text, gap_start, src.start(right)):
        if match.group("op"):
            return Token(match.start("op"), match.end("op"), " ".join(match.group("op").split()))
    return None


def replace_in_node(src: Source, node: ast.AST, replacements: Sequence[tuple[int, int, str]]) -> str:
    """The source text of ``node`` with some absolute character ranges replaced."""
    start, end = src.start(node), src.end(node)
    pieces, cursor = [], start
    for lo, hi, new in sorted(replacements):
        pieces += [src.text[cursor:lo], new]
        cursor = hi
    pieces.append(src.text[cursor:end])
    return "".join(pieces)


def _is_parenthesized(src: Source, node: ast.AST) -> bool:
    """Whether ``node`` is directly enclosed in parentheses (of a group or a call) in the source."""
    before = src.text[: src.start(node)].rstrip()
    after = src.text[src.end(node) :].lstrip()
    return before.endswith("(") and after.startswith(")")


def _isolated(src: Source, node: ast.AST, parent: ast.AST) -> bool:
    """Whether nothing around ``node`` can bind more tightly than any expression would."""
    if isinstance(parent, ast.stmt | ast.keyword | ast.List | ast.Tuple | ast.Set | ast.Dict | ast.Lambda):
        return True
    if isinstance(parent, ast.Call) and node is not parent.func:
        return True
    if isinstance(parent, ast.Subscript) and node is parent.slice:
        return True
    return _is_parenthesized(src, node)


def expr_edit(
    ctx: Context, node: ast.AST, new: str, expected: ast.AST, *, parent: ast.AST | None = None
) -> Edit | None:
    """Replace the span of ``node`` by ``new`` if that parses to ``expected``.

    With ``parent`` given, ``new`` binds more loosely than the original, so it is parenthesized
    unless the surroundings make that unnecessary.
    """
    if not parses_as(new, expected):
        return None
    if parent is not None and not _isolated(ctx.src, node, parent):
        new = f"({new})"
    return Edit(ctx.src.start(node), ctx.src.end(node), new)


def propose(operator: str, edit: Edit | None, description: str) -> Iterator[Proposal]:
    """Zero or one proposal, depending on whether the edit could be made."""
    if edit is not None:
        yield Proposal(operator, (edit,), description)


def is_str(node: ast.AST) -> bool:
    """Whether ``node`` is obviously a string (a str/bytes literal or an f-string)."""
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str | bytes)
    )


def is_int(node: ast.AST) -> bool:
    """An int literal (not a bool)."""
    return isinstance(node, ast.Constant) and type(node.value) is int


def is_simple(node: ast.AST) -> bool:
    """Names, literals and dotted attribute chains: safe to move around."""
    if isinstance(node, ast.Attribute):
        return is_simple(node.value) and not isinstance(node.value, ast.Constant)
    return isinstance(node, ast.Name | ast.Constant)


def is_negative_literal(node: ast.AST) -> bool:
    """``-1`` and the like: handled as int literals, not as computed bounds."""
    return isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant)


def format_int(value: int, like: str) -> str:
    """``value`` written in the same base as the literal ``like``."""
    prefix = like[:2].lower()
    if prefix == "0x":
        return hex(value)
    if prefix == "0o":
        return oct(value)
    if prefix == "0b":
        return bin(value)
    return str(value)


def block_of(stmt: ast.stmt, parent: ast.AST) -> list[ast.stmt]:
    """The statement list of ``parent`` that contains ``stmt``."""
    for field in ("body", "orelse", "finalbody"):
        block = getattr(parent, field, None)
        if isinstance(block, list) and any(item is stmt for item in block):
            return block
    return []


def whole_lines(src: Source, first: ast.stmt, last: ast.stmt) -> tuple[int, int]:
    """Character range of the full lines holding statements ``first``..``last``, line breaks included."""
    return src.line_start(first.lineno), src.line_start(last.end_lineno + 1)  # type: ignore[operator]


def first_parameter(function: Function) -> str | None:
    """The first positional parameter other than ``self``/``cls``."""
    names = [a.arg for a in function.args.posonlyargs + function.args.args]
    return next((name for name in names if name not in ("self", "cls")), None)
