"""What the explorer and synthesizer roles reply, as pydantic models for ``role.structured``.

The explorer's reply is a call of one of the env's tools with valid arguments: :func:`call_model`
builds, per env, ``{"call": {"name": <tool>, "arguments": {...}}}`` where ``call`` is one of the
tools (``anyOf``, one branch per tool, its name a constant and its arguments the tool's own
parameter schema as a closed pydantic model). A guided turn asks only for the arguments of the
chosen tool (:func:`arguments_model`). The synthesizer's reply is the user's request
(:func:`request_model`). On the ``policy`` and ``local`` backends the engine holds the reply to the
schema while generating; on ``openai`` it is sent as ``response_format`` (the wrapping object is
there because strict structured outputs need an object at the root).

Tool parameters are converted from JSON Schema for the common shapes (string with enum, pattern or
length; integer and number with bounds; boolean; arrays; nested objects); a string without a
``maxLength`` gets :data:`MAX_STRING` and an integer without bounds ±:data:`MAX_INTEGER`, so that a
reply held to the schema ends within its token budget. The strict schema makes a reply write every
parameter; one written with its default is dropped from the call (:func:`arguments_of`). A
free-form object parameter (no ``properties``) can only be ``{}`` under the strict schema; an
unknown shape (``$ref``, ``oneOf``) is any JSON value.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, create_model

from horizonrl.types import ToolSpec

#: the longest string argument the explorer may write when the tool states no maxLength
MAX_STRING = 80
#: the largest integer argument (either sign) when the tool states no bounds
MAX_INTEGER = 10**9
#: the most items of an array argument when the tool states no maxItems
MAX_ITEMS = 8


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _model_name(text: str) -> str:
    return "".join(part.capitalize() for part in "".join(c if c.isalnum() else " " for c in text).split())


def _type_of(schema: dict[str, Any], where: str) -> Any:
    """The Python type (with pydantic constraints) of one JSON-schema node."""
    if schema.get("enum"):
        return Literal[tuple(schema["enum"])]
    if "const" in schema:
        return Literal[schema["const"]]
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"] and the like
        kinds = [k for k in kind if k != "null"]
        inner = _type_of({**schema, "type": kinds[0]}, where) if kinds else Any
        return inner | None if "null" in kind else inner
    if kind == "string":
        return _string(schema)
    if kind == "integer":
        low = schema.get("minimum", -MAX_INTEGER)
        high = schema.get("maximum", MAX_INTEGER)
        return _annotated(int, Field(ge=low, le=high))
    if kind == "number":
        extra = {k: schema[k] for k in ("minimum", "maximum") if k in schema}
        return _annotated(float, Field(**{"ge" if k == "minimum" else "le": v for k, v in extra.items()}))
    if kind == "boolean":
        return bool
    if kind == "array":
        item = _type_of(schema.get("items") or {}, f"{where}Item")
        return _annotated(
            list[item],  # type: ignore[valid-type]
            Field(min_length=schema.get("minItems", 0), max_length=schema.get("maxItems", MAX_ITEMS)),
        )
    if kind == "object" and "properties" in schema:
        return object_model(schema, where)
    if kind == "object":
        return dict[str, Any]
    return Any


def _string(schema: dict[str, Any]) -> Any:
    return _annotated(
        str,
        Field(
            min_length=schema.get("minLength"),
            max_length=schema.get("maxLength", MAX_STRING),
            pattern=schema.get("pattern"),
        ),
    )


def _annotated(kind: Any, info: Any) -> Any:
    return Annotated[kind, info]


def object_model(schema: dict[str, Any], name: str) -> type[BaseModel]:
    """A closed pydantic model of a JSON-schema object: each property a field (aliased, so any
    property name works), required ones without a default."""
    required = set(schema.get("required", ()))
    fields: dict[str, Any] = {}
    for i, (prop, sub) in enumerate((schema.get("properties") or {}).items()):
        sub = sub if isinstance(sub, dict) else {}
        kind = _type_of(sub, f"{name}{_model_name(prop)}")
        description = sub.get("description")
        if prop in required and "default" not in sub:
            info = Field(..., alias=prop, description=description)
        elif "default" in sub:
            info = Field(sub["default"], alias=prop, description=description)
        else:
            kind = kind | None
            info = Field(None, alias=prop, description=description)
        fields[f"p{i}"] = (kind, info)
    return create_model(_model_name(name) or "Arguments", __base__=_Closed, **fields)


def arguments_model(spec: ToolSpec) -> type[BaseModel]:
    """The arguments of ``spec``, as a closed pydantic model of its parameter schema."""
    return _arguments_model(spec.model_dump_json())


@lru_cache(maxsize=256)
def _arguments_model(spec_json: str) -> type[BaseModel]:
    spec = ToolSpec.model_validate_json(spec_json)
    parameters = {"type": "object", "properties": {}, **spec.parameters}
    return object_model(parameters, f"{spec.name}_arguments")


def call_model(tools: list[ToolSpec]) -> type[BaseModel]:
    """``{"call": {"name": ..., "arguments": {...}}}``: a call of one of ``tools`` with arguments
    valid under its parameter schema."""
    return _call_model(tuple(t.model_dump_json() for t in tools))


@lru_cache(maxsize=64)
def _call_model(specs_json: tuple[str, ...]) -> type[BaseModel]:
    if not specs_json:
        raise ValueError("a call needs at least one tool to choose from")
    branches = []
    for spec_json in specs_json:
        spec = ToolSpec.model_validate_json(spec_json)
        branches.append(
            create_model(
                f"Call{_model_name(spec.name)}",
                __base__=_Closed,
                __doc__=spec.description or None,
                name=(Literal[spec.name], ...),
                arguments=(_arguments_model(spec_json), ...),
            )
        )
    call_type = branches[0] if len(branches) == 1 else Union[tuple(branches)]  # noqa: UP007
    return create_model(
        "ToolCallReply",
        __base__=_Closed,
        call=(call_type, Field(..., description="The call: one tool's name and its arguments.")),
    )


def call_of(value: BaseModel) -> tuple[str, dict[str, Any]]:
    """The ``(name, arguments)`` of a :func:`call_model` reply (optional arguments left unset
    dropped, as if the call had not passed them)."""
    call = value.call  # type: ignore[attr-defined]
    return call.name, arguments_of(call.arguments)


def arguments_of(value: BaseModel) -> dict[str, Any]:
    """The arguments of an :func:`arguments_model` reply under their own names; an optional one the
    reply set to its default (null when it has none) is dropped, as if the call had not passed it
    (in nested objects too): the strict schema makes a reply write every parameter, and a call that
    passes ``passenger_id=""`` for "the default" is not a blank probe."""
    out: dict[str, Any] = {}
    for name, info in type(value).model_fields.items():
        item = getattr(value, name)
        if not info.is_required() and item == info.default:
            continue
        out[info.alias or name] = _plain(item)
    return out


def _plain(item: Any) -> Any:
    if isinstance(item, BaseModel):
        return arguments_of(item)
    if isinstance(item, list):
        return [_plain(x) for x in item]
    return item


def request_model(max_chars: int) -> type[BaseModel]:
    """``{"request": ...}``: the user's request a synthesized task carries out, in one line of at
    most ``max_chars`` characters."""
    return _request_model(max_chars)


@lru_cache(maxsize=16)
def _request_model(max_chars: int) -> type[BaseModel]:
    return create_model(
        "UserRequest",
        __base__=_Closed,
        request=(
            str,
            Field(
                ...,
                min_length=12,
                max_length=max_chars,
                pattern=r"^[^{}<>\n]+$",
                description="What the user asked for, in their own words: one or two sentences.",
            ),
        ),
    )
