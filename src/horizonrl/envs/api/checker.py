"""Executable checks over an API world's final state, in a small declarative form.

A synthesized task carries a checker (``data.checker``) that says what must hold in the world when
the episode ends. It is data, never code from the model: JSON that :func:`parse_checker` validates
against the world's state schema (every field it names must exist) and :func:`holds` evaluates by
walking the state — there is no ``eval``, no attribute access and no call, so a checker cannot run
anything. The forms::

    {"all": [C, ...]}     {"any": [C, ...]}     {"not": C}
    {"field": "balance", "op": "ge", "value": 100}
    {"exists": "orders", "where": C}                          # some item of a collection satisfies C
    {"count": "orders", "where": C, "op": "eq", "value": 2}   # how many items satisfy C ("where" optional)

Inside ``where`` the fields are the items' fields. Operators: ``eq ne lt le gt ge`` (numbers, strings),
``in`` (the field's value is one of a list) and ``contains`` (a string or list field contains the value).

A state schema maps each top-level field to a type name (``"number"``, ``"string"``, ``"bool"``) or,
for a collection, to the schema of its items (a dict of field → type name).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OPS = ("eq", "ne", "lt", "le", "gt", "ge", "in", "contains")
SCALARS = ("number", "string", "bool", "list")
Schema = dict[str, Any]


class CheckerError(ValueError):
    """A checker that does not parse against the world's state schema (the message says where)."""


@dataclass(frozen=True)
class Compare:
    field: str
    op: str
    value: Any


@dataclass(frozen=True)
class AllOf:
    parts: tuple[Check, ...]


@dataclass(frozen=True)
class AnyOf:
    parts: tuple[Check, ...]


@dataclass(frozen=True)
class Not:
    part: Check


@dataclass(frozen=True)
class Exists:
    collection: str
    where: Check | None


@dataclass(frozen=True)
class Count:
    collection: str
    where: Check | None
    op: str
    value: Any


Check = Compare | AllOf | AnyOf | Not | Exists | Count


def parse_checker(data: Any, schema: Schema, at: str = "checker") -> Check:
    """``data`` (parsed JSON) as a checker over states of ``schema``; a :class:`CheckerError` names
    the first thing that is wrong (an unknown form, field or operator) and what would be valid."""
    if not isinstance(data, dict):
        raise CheckerError(f"{at}: expected an object, got {type(data).__name__}")
    forms = [k for k in ("all", "any", "not", "field", "exists", "count") if k in data]
    if len(forms) != 1:
        raise CheckerError(
            f"{at}: expected exactly one of all, any, not, field, exists, count; got keys {sorted(data)}"
        )
    form = forms[0]
    allowed = {
        "all": {"all"},
        "any": {"any"},
        "not": {"not"},
        "field": {"field", "op", "value"},
        "exists": {"exists", "where"},
        "count": {"count", "where", "op", "value"},
    }[form]
    extra = sorted(set(data) - allowed)
    if extra:
        raise CheckerError(f"{at}: unexpected keys {extra} in a {form!r} check (allowed: {sorted(allowed)})")
    if form in ("all", "any"):
        items = data[form]
        if not isinstance(items, list) or not items:
            raise CheckerError(f"{at}.{form}: expected a non-empty list of checks")
        parts = tuple(parse_checker(item, schema, f"{at}.{form}[{i}]") for i, item in enumerate(items))
        return AllOf(parts) if form == "all" else AnyOf(parts)
    if form == "not":
        return Not(parse_checker(data["not"], schema, f"{at}.not"))
    if form == "field":
        name = data["field"]
        kind = _scalar_field(schema, name, at)
        op, value = _op(data, at), data.get("value")
        _check_value(op, value, kind, f"{at} ({name})")
        return Compare(name, op, value)
    name = data[form]
    items = _collection(schema, name, at)
    where = parse_checker(data["where"], items, f"{at}.where") if "where" in data else None
    if form == "exists":
        return Exists(name, where)
    op, value = _op(data, at), data.get("value")
    _check_value(op, value, "number", f"{at} (count of {name})")
    return Count(name, where, op, value)


def _scalar_field(schema: Schema, name: Any, at: str) -> str:
    if not isinstance(name, str) or name not in schema:
        raise CheckerError(f"{at}: unknown state field {name!r} (fields: {', '.join(sorted(schema))})")
    kind = schema[name]
    if isinstance(kind, dict):
        raise CheckerError(f"{at}: {name!r} is a collection; use exists or count over it")
    return str(kind)


def _collection(schema: Schema, name: Any, at: str) -> Schema:
    if not isinstance(name, str) or name not in schema:
        raise CheckerError(f"{at}: unknown state field {name!r} (fields: {', '.join(sorted(schema))})")
    items = schema[name]
    if not isinstance(items, dict):
        raise CheckerError(f"{at}: {name!r} is not a collection (it is a {items}); use a field check")
    return items


def _op(data: dict[str, Any], at: str) -> str:
    op = data.get("op")
    if op not in OPS:
        raise CheckerError(f"{at}: unknown operator {op!r} (operators: {', '.join(OPS)})")
    if "value" not in data:
        raise CheckerError(f"{at}: a comparison needs a value")
    return str(op)


def _check_value(op: str, value: Any, kind: str, at: str) -> None:
    if op == "in" and not isinstance(value, list):
        raise CheckerError(f"{at}: 'in' needs a list value")
    if op in ("lt", "le", "gt", "ge") and (not isinstance(value, (int, float)) or isinstance(value, bool)):
        raise CheckerError(f"{at}: {op!r} needs a number, got {value!r}")
    if op == "contains" and kind not in ("string", "list"):
        raise CheckerError(f"{at}: 'contains' applies to string or list fields, not {kind}")


def holds(check: Check, state: dict[str, Any]) -> bool:
    """Whether ``check`` holds in ``state`` (a plain dict of the world's fields)."""
    if isinstance(check, AllOf):
        return all(holds(part, state) for part in check.parts)
    if isinstance(check, AnyOf):
        return any(holds(part, state) for part in check.parts)
    if isinstance(check, Not):
        return not holds(check.part, state)
    if isinstance(check, Compare):
        return compare(state.get(check.field), check.op, check.value)
    items = [
        item for item in state.get(check.collection, []) if check.where is None or holds(check.where, item)
    ]
    if isinstance(check, Exists):
        return bool(items)
    return compare(len(items), check.op, check.value)


def compare(actual: Any, op: str, expected: Any) -> bool:
    """``actual op expected``; a comparison between incomparable values is False, never an error."""
    try:
        if op == "eq":
            return _norm(actual) == _norm(expected)
        if op == "ne":
            return _norm(actual) != _norm(expected)
        if op == "in":
            return _norm(actual) in [_norm(v) for v in expected]
        if op == "contains":
            if isinstance(actual, str):
                return str(expected).lower() in actual.lower()
            return isinstance(actual, list) and _norm(expected) in [_norm(v) for v in actual]
        if actual is None or isinstance(actual, bool):
            return False
        a, b = float(actual), float(expected)
        return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[op]
    except (TypeError, ValueError):
        return False


def _norm(value: Any) -> Any:
    """Strings compare case- and edge-space-insensitively; ints and floats by value."""
    if isinstance(value, str):
        return value.strip().lower()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def fields_named(check: Check) -> set[str]:
    """The top-level state fields a checker reads (for reports)."""
    if isinstance(check, (AllOf, AnyOf)):
        return set().union(*(fields_named(p) for p in check.parts))
    if isinstance(check, Not):
        return fields_named(check.part)
    if isinstance(check, Compare):
        return {check.field}
    return {check.collection}
