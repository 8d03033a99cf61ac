"""Tools from typed Python functions.

A tool is a plain (sync or async) function with type hints and a Google-style docstring. Its JSON
schema comes from the signature (via pydantic) and its descriptions from the docstring::

    @tool
    def calculator(expression: str) -> str:
        '''Evaluate an arithmetic expression.

        Args:
            expression: The expression, e.g. "12 * (3 + 4)".
        '''

Calling a tool validates the model's arguments first; a bad argument becomes a
:class:`ToolArgumentError` whose message tells the model what was expected.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from horizonrl.types import ToolSpec

_TOOL_ATTR = "__horizon_tool__"


class ToolArgumentError(ValueError):
    """The model called a tool with missing, unknown or ill-typed arguments."""


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {param: description})."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    section = "description"
    current: str | None = None
    param_indent: int | None = None  # indentation of the parameter lines in the Args section
    for line in lines:
        stripped = line.strip()
        if re.fullmatch(r"(Args|Arguments|Parameters):", stripped):
            section, current, param_indent = "args", None, None
            continue
        if re.fullmatch(r"(Returns|Raises|Yields|Examples?|Notes?):", stripped):
            section, current = "other", None
            continue
        if section == "description":
            description.append(line)
        elif section == "args" and stripped:
            indent = len(line) - len(line.lstrip())
            match = re.match(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", stripped)
            if match and (param_indent is None or indent <= param_indent):
                param_indent = indent
                current = match.group(1).lstrip("*")
                params[current] = match.group(2).strip()
            elif current:
                params[current] = (params[current] + " " + stripped).strip()
    return " ".join(" ".join(description).split()), params


class Tool:
    """A callable tool: the function, its ToolSpec and an argument validator."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        self.is_async = inspect.iscoroutinefunction(fn)
        description, param_docs = parse_docstring(fn.__doc__)
        signature = inspect.signature(fn)
        hints = get_type_hints(fn)
        fields: dict[str, Any] = {}
        for pname, param in signature.parameters.items():
            if pname in ("self", "cls"):
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"tool {self.name!r}: *args/**kwargs cannot be described to a model")
            if pname not in hints:
                raise TypeError(f"tool {self.name!r}: parameter {pname!r} needs a type hint")
            default = ... if param.default is param.empty else param.default
            fields[pname] = (hints[pname], Field(default, description=param_docs.get(pname)))
        self.args_model: type[BaseModel] = create_model(  # type: ignore[call-overload]
            f"{self.name}_args", __config__=ConfigDict(extra="forbid", coerce_numbers_to_str=True), **fields
        )
        schema = self.args_model.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        schema.setdefault("properties", {})
        schema.setdefault("required", [])
        self.spec = ToolSpec(name=self.name, description=description, parameters=schema)

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check and coerce arguments; raise ToolArgumentError with a message the model can act on."""
        if not isinstance(arguments, dict):
            raise ToolArgumentError(f"arguments of {self.name} must be a JSON object, got {arguments!r}")
        try:
            validated = self.args_model.model_validate(arguments)
        except ValidationError as exc:
            problems = []
            for err in exc.errors():
                loc = ".".join(str(p) for p in err["loc"]) or "arguments"
                problems.append(f"{loc}: {err['msg']}")
            expected = ", ".join(
                f"{k}: {v.get('type', 'any')}" for k, v in self.spec.parameters["properties"].items()
            )
            raise ToolArgumentError(
                f"bad arguments for {self.name}: {'; '.join(problems)}. Expected {{{expected}}}"
            ) from None
        return {k: getattr(validated, k) for k in type(validated).model_fields}

    async def __call__(self, arguments: dict[str, Any], bound_to: Any = None) -> Any:
        kwargs = self.validate(arguments)
        fn = self.fn.__get__(bound_to) if bound_to is not None else self.fn
        result = fn(**kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Mark a function or an Env method as a tool. Usable as ``@tool`` or ``@tool(name="...")``."""

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        setattr(f, _TOOL_ATTR, name or f.__name__)
        return f

    return mark(fn) if fn is not None else mark


def collect_tools(obj: Any) -> dict[str, Tool]:
    """All methods of ``obj``'s class marked with ``@tool``, in definition order, as Tools."""
    return dict(_class_tools(type(obj)))


@functools.cache
def _class_tools(cls: type) -> dict[str, Tool]:
    tools: dict[str, Tool] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            tool_name = getattr(value, _TOOL_ATTR, None)
            if tool_name is not None:
                tools[tool_name] = Tool(value, name=tool_name)
            elif attr in tools and value is None:
                del tools[attr]
    return tools
