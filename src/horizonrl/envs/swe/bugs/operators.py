"""The mutation operators: each takes (node, parent, context) and yields proposals.

Each works on one kind of node of a function body and proposes minimal edits (:mod:`.edits`);
:data:`OPERATOR_FUNCTIONS` lists them in the order of :data:`OPERATORS`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator

from horizonrl.envs.swe.bugs.edits import (
    Context,
    Edit,
    Proposal,
    block_of,
    expr_edit,
    first_parameter,
    format_int,
    is_int,
    is_negative_literal,
    is_simple,
    is_str,
    propose,
    replace_in_node,
    same_tree,
    short,
    token_between,
    whole_lines,
)

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

# A removed statement spans at most this many lines.
MAX_REMOVED_LINES = 5

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

# Calls whose positional arguments commute: swapping them is an equivalent mutant, not a bug.
_SYMMETRIC_CALLS = frozenset({"max", "min", "gcd", "lcm", "hypot", "isclose"})


def _invert_condition(node: ast.AST, parent: ast.AST, ctx: Context) -> Iterator[Proposal]:
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
        yield from propose(
            "invert_condition",
            expr_edit(ctx, test, new, expected),
            f"inverted the condition `{short(text)}` to `{short(new)}`",
        )


def _change_compare(node: ast.AST, parent: ast.AST, ctx: Context) -> Iterator[Proposal]:
    """Swap one comparison operator of a comparison chain."""
    if not isinstance(node, ast.Compare):
        return
    for i, op in enumerate(node.ops):
        left = node.left if i == 0 else node.comparators[i - 1]
        token = token_between(ctx.src, left, node.comparators[i], _COMPARE_TOKEN)
        new_op = _COMPARE_SWAP[type(op)]
        if token is None or token.text != _COMPARE_TEXT[type(op)]:
            continue
        new_text = _COMPARE_TEXT[new_op]
        new = replace_in_node(ctx.src, node, [(token.start, token.end, new_text)])
        ops = [*node.ops[:i], new_op(), *node.ops[i + 1 :]]
        expected = ast.Compare(node.left, ops, node.comparators)
        yield from propose(
            "change_compare",
            expr_edit(ctx, node, new, expected),
            f"changed `{_COMPARE_TEXT[type(op)]}` to `{new_text}` in `{short(ctx.src.segment(node))}`",
        )


def _change_binop(node: ast.AST, parent: ast.AST, ctx: Context) -> Iterator[Proposal]:
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
        return is_str(left)
    return isinstance(op, ast.Add | ast.Mult) and (is_str(left) or is_str(right))


def _change_arithmetic(node: ast.BinOp, parent: ast.AST, ctx: Context) -> Iterator[Proposal]:
    """``a + b`` -> ``a - b`` and the like (see ``_BINOP_SWAP``)."""
    new_op = _BINOP_SWAP.get(type(node.op))
    if new_op is None or _string_like_operation(node.op, node.left, node.right):
        return
    token = token_between(ctx.src, node.left, node.right, _BINOP_TOKEN)
    if token is None or token.text != _BINOP_TEXT[type(node.op)]:
        return
    new = replace_in_node(ctx.src, node, [(token.start, token.end, _BINOP_TEXT[new_op])])
    looser = _BINOP_PRECEDENCE[new_op] < _BINOP_PRECEDENCE[type(node.op)]
    edit = expr_edit(
        ctx, node, new, ast.BinOp(node.left, new_op(), node.right), parent=parent if looser else None
    )
    old_text, new_text = _BINOP_TEXT[type(node.op)], _BINOP_TEXT[new_op]
    yield from propose(
        "change_binop", edit, f"changed `{old_text}` to `{new_text}` in `{short(ctx.src.segment(node))}`"
    )


def _change_augmented(node: ast.AugAssign, ctx: Context) -> Iterator[Proposal]:
    """``x += y`` -> ``x -= y`` and the like."""
    new_op = _BINOP_SWAP.get(type(node.op))
    if new_op is None or _string_like_operation(node.op, node.target, node.value):
        return
    token = token_between(ctx.src, node.target, node.value, _AUGOP_TOKEN)
    if token is None or token.text != _BINOP_TEXT[type(node.op)] + "=":
        return
    new_text = _BINOP_TEXT[new_op] + "="
    edit = Edit(token.start, token.end, new_text)
    yield Proposal("change_binop", (edit,), f"changed `{token.text}` to `{new_text}`")


def _change_boolean(node: ast.BoolOp, parent: ast.AST, ctx: Context) -> Iterator[Proposal]:
    """``a and b`` -> ``a or b`` and back (every operator of the chain)."""
    new_op: ast.boolop = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    old_text, new_text = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
    replacements = []
    for left, right in zip(node.values, node.values[1:], strict=False):
        token = token_between(ctx.src, left, right, _BOOLOP_TOKEN)
        if token is None or token.text != old_text:
            return
        replacements.append((token.start, token.end, new_text))
    new = replace_in_node(ctx.src, node, replacements)
    looser = isinstance(new_op, ast.Or)
    edit = expr_edit(ctx, node, new, ast.BoolOp(new_op, node.values), parent=parent if looser else None)
    yield from propose(
        "change_binop", edit, f"changed `{old_text}` to `{new_text}` in `{short(ctx.src.segment(node))}`"
    )


def _off_by_one(node: ast.AST, parent: ast.AST, ctx: Context) -> Iterator[Proposal]:
    """An int literal n -> n+1 / n-1 (never negative); a computed slice bound ``x[:n]`` -> ``x[:n + 1]``."""
    if is_int(node):
        text = ctx.src.segment(node)
        negated = isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.USub)
        for value in (node.value + 1, node.value - 1):
            if value < 0 or (value == 0 and negated):  # no ``-0``
                continue
            new = format_int(value, text)
            yield from propose(
                "off_by_one",
                expr_edit(ctx, node, new, ast.Constant(value)),
                f"changed the integer `{text}` to `{new}`",
            )
    elif isinstance(node, ast.Slice):
        for bound in (node.lower, node.upper):
            if bound is None or isinstance(bound, ast.Constant) or is_negative_literal(bound):
                continue
            text = ctx.src.segment(bound)
            new = f"{text} + 1"
            expected = ast.BinOp(bound, ast.Add(), ast.Constant(1))
            yield from propose(
                "off_by_one",
                expr_edit(ctx, bound, new, expected),
                f"changed the slice bound `{short(text)}` to `{short(new)}`",
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


def _remove_statement(node: ast.AST, parent: ast.AST, ctx: Context) -> Iterator[Proposal]:
    """Delete one simple statement (its lines), or replace it by ``pass`` where it is needed."""
    if not isinstance(node, ast.stmt) or not _removable(node):
        return
    if node.end_lineno - node.lineno + 1 > MAX_REMOVED_LINES:  # type: ignore[operator]
        return
    src, block = ctx.src, block_of(node, parent)
    description = f"removed the statement `{short(src.segment(node))}`"
    if len(block) > 1 and src.owns_lines(node, node):
        start, end = whole_lines(src, node, node)
        yield Proposal("remove_statement", (Edit(start, end, ""),), description)
    else:
        yield Proposal("remove_statement", (Edit(src.start(node), src.end(node), "pass"),), description)


def _swap_arguments(node: ast.AST, parent: ast.AST, ctx: Context) -> Iterator[Proposal]:
    """Swap two adjacent positional arguments of a call when both are simple and different."""
    if not isinstance(node, ast.Call):
        return
    if isinstance(node.func, ast.Name) and node.func.id in _SYMMETRIC_CALLS:
        return
    for first, second in zip(node.args, node.args[1:], strict=False):
        if not (is_simple(first) and is_simple(second)) or same_tree(first, second):
            continue
        a, b = ctx.src.segment(first), ctx.src.segment(second)
        edits = (
            Edit(ctx.src.start(first), ctx.src.end(first), b),
            Edit(ctx.src.start(second), ctx.src.end(second), a),
        )
        yield Proposal(
            "swap_arguments", edits, f"swapped the arguments `{short(a)}` and `{short(b)}` of a call"
        )


def _break_return(node: ast.AST, parent: ast.AST, ctx: Context) -> Iterator[Proposal]:
    """``return <expr>`` -> ``return None``, or -> ``return <first parameter>``."""
    if not isinstance(node, ast.Return) or node.value is None:
        return
    value = node.value
    if isinstance(value, ast.Constant) and value.value is None:
        return
    text = ctx.src.segment(value)
    replacements = ["None"]
    parameter = first_parameter(ctx.function)
    if parameter is not None and not (isinstance(value, ast.Name) and value.id == parameter):
        replacements.append(parameter)
    for new in replacements:
        yield Proposal(
            "break_return",
            (Edit(ctx.src.start(value), ctx.src.end(value), new),),
            f"changed `return {short(text)}` to `return {new}`",
        )


def _swap_if_else(node: ast.AST, parent: ast.AST, ctx: Context) -> Iterator[Proposal]:
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
    b0, b1 = whole_lines(src, body[0], body[-1])
    e0, e1 = whole_lines(src, orelse[0], orelse[-1])
    body_text, else_text = src.text[b0:b1], src.text[e0:e1]
    if _ELSE_LINE.fullmatch(src.text, b1, e0) is None or not else_text.endswith(("\n", "\r")):
        return
    edits = (Edit(b0, b1, else_text), Edit(e0, e1, body_text))
    yield Proposal(
        "swap_if_else", edits, f"swapped the if and else bodies of `if {short(src.segment(node.test))}`"
    )


def _change_constant(node: ast.AST, parent: ast.AST, ctx: Context) -> Iterator[Proposal]:
    """``True`` <-> ``False``; an empty string literal <-> a single space."""
    if not isinstance(node, ast.Constant):
        return
    text = ctx.src.segment(node)
    if isinstance(node.value, bool) and text in ("True", "False"):
        new, value = ("False", False) if node.value else ("True", True)
        yield from propose(
            "change_constant", expr_edit(ctx, node, new, ast.Constant(value)), f"changed `{text}` to `{new}`"
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
    yield from propose(
        "change_constant", expr_edit(ctx, node, new, ast.Constant(value)), f"changed `{text}` to `{new}`"
    )


OPERATOR_FUNCTIONS: tuple[tuple[str, Callable[[ast.AST, ast.AST, Context], Iterator[Proposal]]], ...] = (
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
assert tuple(name for name, _ in OPERATOR_FUNCTIONS) == OPERATORS
