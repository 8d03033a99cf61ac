"""A safe calculator for agents: arithmetic over Python's ``ast``, never ``eval``/``exec``.

Numbers, ``+ - * / // % **``, unary signs and parentheses; thousands separators ("4,817"), ``x``/``×``
and ``÷``; bounded expression length, exponents and magnitudes. Errors are :class:`CalculatorError`
(a ToolArgumentError), so a tool env shows the model a plain ``Error: <message>``.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from horizonrl.envs.tools import ToolArgumentError

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 100
MAX_MAGNITUDE = 10**100
_ALLOWED = "only numbers, + - * / // % **, unary +/- and parentheses are allowed"
_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])")
_THOUSANDS_FULL = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_ANSWER = re.compile(r"[+-]?(?:\d{1,100}\.?\d{0,100}|\.\d{1,100})(?:[eE][+-]?\d{1,2})?")  # no 1e999999
_TIMES = re.compile(r"(?<=[\d)])\s*[xX]\s*(?=[\d(+\-.])")

Number = int | float


class CalculatorError(ToolArgumentError):
    """An expression the calculator cannot or will not evaluate.

    A subclass of ToolArgumentError so ToolEnv shows the model just ``Error: <message>``: a bad
    expression is a bad argument, not a crash of the tool.
    """


_TOO_LARGE = "the result is too large (the calculator's limit is 1e100)"


def _checked(x: Any) -> Number:
    if isinstance(x, complex):
        raise CalculatorError("the result is not a real number")
    if math.isnan(x) or abs(x) > MAX_MAGNITUDE:
        raise CalculatorError(_TOO_LARGE)
    return x


def _divide(op: Callable[[Number, Number], Number]) -> Callable[[Number, Number], Number]:
    def apply(a: Number, b: Number) -> Number:
        if b == 0:
            raise CalculatorError("division by zero")
        if op is operator.truediv and isinstance(a, int) and isinstance(b, int) and a % b == 0:
            return a // b  # exact integer result, no float rounding of big numbers
        return op(a, b)

    return apply


def _pow(a: Number, b: Number) -> Number:
    if abs(b) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {b} is too large (at most {MAX_EXPONENT} in absolute value)")
    if a == 0 and b < 0:
        raise CalculatorError("division by zero (0 to a negative power)")
    if abs(a) > 1 and b > 0 and b * math.log10(abs(a)) > 100:
        raise CalculatorError(_TOO_LARGE)
    try:
        return a**b
    except OverflowError:
        raise CalculatorError(_TOO_LARGE) from None


_BINOPS: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: _divide(operator.truediv),
    ast.FloorDiv: _divide(operator.floordiv),
    ast.Mod: _divide(operator.mod),
    ast.Pow: _pow,
}


def _unsupported(node: ast.AST) -> str:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        return "^ is not supported; write powers as 2 ** 10"
    if isinstance(node, ast.Tuple):
        return "commas are only allowed as thousands separators, e.g. 4,817"
    what = {ast.Name: "the name", ast.Call: "a function call", ast.Attribute: "attribute access"}
    name = f" {node.id!r}" if isinstance(node, ast.Name) else ""
    return f"{what.get(type(node), type(node).__name__)}{name} is not allowed: {_ALLOWED}"


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return _checked(node.value)
        raise CalculatorError(f"only numbers are allowed, not {node.value!r}")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _eval(node.operand)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _checked(_BINOPS[type(node.op)](_eval(node.left), _eval(node.right)))
    raise CalculatorError(_unsupported(node))


def calculate(expression: str) -> Number:
    """Evaluate an arithmetic expression safely; CalculatorError says what is wrong with it.

    Accepts thousands separators in unambiguous digit groups ("4,817"), ``x``/``×`` for
    multiplication and ``÷`` for division, since models copy numbers and signs from the question.
    """
    text = expression.strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(
            f"expression is too long ({len(text)} characters; at most {MAX_EXPRESSION_CHARS})"
        )
    text = text.rstrip("=").strip().replace("×", "*").replace("÷", "/").replace("−", "-")
    text = _TIMES.sub("*", text)
    text = _THOUSANDS.sub(lambda m: m.group().replace(",", ""), text)
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError) as exc:
        msg = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        raise CalculatorError(f"could not parse {expression.strip()!r}: {msg}") from None
    return _eval(tree)


def format_number(x: Number) -> str:
    """Integral results without ".0" ("14497"); others with up to 12 significant digits."""
    if isinstance(x, int):
        return str(x)
    if x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    return f"{x:.12g}"


def parse_answer(text: str) -> Fraction:
    """The number in a final answer ("14,497", " 14497 ", "14497.0"); ValueError if there is none."""
    s = text.strip()
    if _THOUSANDS_FULL.fullmatch(s):
        s = s.replace(",", "")
    if not _ANSWER.fullmatch(s):
        raise ValueError(f"{text.strip()[:100]!r} is not a number")
    return Fraction(s)
