"""Structured replies of roles: a role that expects structure declares it as a pydantic model and gets
back a validated object.

``await role.structured(messages, Verdict)`` returns a :class:`StructuredReply` whose ``value`` is a
``Verdict`` (or None, with ``error`` saying why the reply could not be used). How the structure is
obtained depends on the backend and ``roles.<name>.structured``:

- ``enforce`` (the default): on the ``policy`` and ``local`` backends the engine holds the reply to
  the model's JSON schema token by token (:class:`horizonrl.engine.constraints.Constraint`), so the
  reply parses unless ``max_tokens`` cut it off; on ``openai`` the schema is sent as
  ``response_format`` (``json_schema``, ``strict``), which vLLM, SGLang, hosted APIs and
  ``horizon serve`` enforce.
- ``parse``: free text, read by :func:`parse_reply` (the first JSON object in the reply), for
  endpoints that can do neither. Every role counts the replies it could not use
  (``usage.unusable``).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

T = TypeVar("T", bound=BaseModel)


@dataclass
class StructuredReply(Generic[T]):
    """A role's reply to a structured request: the validated object (None when unusable), the raw
    text, why it was unusable, and whether the schema was enforced while generating."""

    value: T | None
    text: str
    error: str | None = None
    enforced: bool = False

    @property
    def ok(self) -> bool:
        return self.value is not None


def output_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema in the strict form structured-output endpoints require: every object
    closed (``additionalProperties: false``) and every property required (a default still validates
    when the reply writes it)."""
    schema = copy.deepcopy(model.model_json_schema())

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" or "properties" in node:
                props = node.get("properties", {})
                node["additionalProperties"] = False
                node["required"] = list(props)
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema)
    return schema


def first_json_object(text: str) -> Any:
    """The first JSON object in ``text`` (code fences and text around it allowed); ValueError when
    there is none."""
    start = text.find("{")
    decoder = json.JSONDecoder()
    while start >= 0:
        try:
            obj, _ = decoder.raw_decode(text[start:])
            return obj
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
    raise ValueError("no JSON object in the reply")


def parse_reply(text: str, model: type[T], enforced: bool = False) -> StructuredReply[T]:
    """``text`` validated as ``model``: the whole text as JSON, else its first JSON object."""
    try:
        return StructuredReply(model.model_validate_json(text.strip()), text, None, enforced)
    except ValidationError as exc:
        whole_error = _one_line(exc)
    try:
        obj = first_json_object(text)
    except ValueError as exc:
        return StructuredReply(None, text, f"{exc} ({whole_error})" if enforced else str(exc), enforced)
    try:
        return StructuredReply(model.model_validate(obj), text, None, enforced)
    except ValidationError as exc:
        return StructuredReply(None, text, _one_line(exc), enforced)


def _one_line(exc: ValidationError) -> str:
    first = exc.errors()[0] if exc.errors() else {"msg": str(exc), "loc": ()}
    where = ".".join(str(p) for p in first.get("loc", ())) or "the reply"
    return f"{where}: {first.get('msg')}"
