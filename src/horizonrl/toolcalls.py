"""Tool-call text format: writing calls, and parsing them out of model output.

The format is the Hermes/Qwen one that many open models were tuned on::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12 * 7"}}
    </tool_call>

The parser is tolerant of what small models actually write: a missing closing tag, tag spelling
variants (``<toolcall>``, ``<tool-call>``, ``<|tool_call|>``), code fences, ``arguments`` given as a
JSON string, ``parameters``/``args`` instead of ``arguments``, the OpenAI ``{"function": {...}}``
shape, single-quoted Python-style dicts, trailing commas, and trailing text after the object.
Anything else is a :class:`ParseResult` with an ``error`` that tells the model the valid format.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

from horizonrl.toolformats import tool_format
from horizonrl.types import ToolCall, ToolSpec

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

_OPEN_RE = re.compile(r"<\|?\s*tool[_\- ]?call\s*\|?>", re.IGNORECASE)
_CLOSE_RE = re.compile(r"<\|?\s*/\s*tool[_\- ]?call\s*\|?>", re.IGNORECASE)
_FENCE_RE = re.compile(r"```(?:json|JSON|python)?\s*(.*?)```", re.DOTALL)
_TRAILING_COMMA_RE = re.compile(r",\s*([}\]])")
_ARG_KEYS = ("arguments", "parameters", "args", "input", "params")


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The canonical text of one tool call, as the model is asked to write it (Hermes format)."""
    return tool_format("hermes").render([(name, arguments)])


@dataclass
class ParseResult:
    """Tool calls found in one model turn, or why none could be read."""

    calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None
    tolerated: list[str] = field(default_factory=list)  # deviations from the canonical format

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.calls)


def _load_object(text: str, tolerated: list[str]) -> Any:
    """Read the first JSON-ish object in ``text``; raise ValueError when there is none."""
    fence = _FENCE_RE.search(text)
    if fence:
        text = fence.group(1)
        tolerated.append("code_fence")
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object found")
    text = text[start:]
    try:
        obj, end = json.JSONDecoder().raw_decode(text)
        if text[end:].strip():
            tolerated.append("trailing_text")
        return obj
    except json.JSONDecodeError:
        pass
    candidate = _balanced_prefix(text)
    try:
        obj = json.loads(_TRAILING_COMMA_RE.sub(r"\1", candidate))
        tolerated.append("trailing_comma")
        return obj
    except json.JSONDecodeError:
        pass
    json_words = candidate.replace("true", "True").replace("false", "False").replace("null", "None")
    for pythonish in (candidate, json_words):
        try:
            obj = ast.literal_eval(pythonish)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        try:  # a Python literal may hold what JSON cannot (a set, bytes, a tuple key): refuse those
            obj = json.loads(json.dumps(obj))
        except (TypeError, ValueError):
            raise ValueError("the tool call holds values JSON cannot carry (such as a set)") from None
        tolerated.append("python_literal")
        return obj
    raise ValueError("the tool call is not valid JSON")


def _balanced_prefix(text: str) -> str:
    """The prefix of ``text`` up to the brace that closes its first ``{`` (or all of it)."""
    depth, quote, escaped = 0, "", False
    for i, ch in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[: i + 1]
    return text


def _to_call(obj: Any, call_id: str, tolerated: list[str]) -> ToolCall:
    if not isinstance(obj, dict):
        raise ValueError("a tool call must be a JSON object with keys 'name' and 'arguments'")
    if "function" in obj and isinstance(obj["function"], dict):
        obj = obj["function"]
        tolerated.append("openai_shape")
    name = obj.get("name", obj.get("tool"))
    if not isinstance(name, str) or not name.strip():
        raise ValueError("the tool call has no 'name' string")
    args: Any = {}
    for key in _ARG_KEYS:
        if key in obj:
            args = obj[key]
            if key != "arguments":
                tolerated.append(f"key_{key}")
            break
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
            tolerated.append("arguments_as_string")
        except json.JSONDecodeError:
            raise ValueError("'arguments' is a string that is not a JSON object") from None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ValueError("'arguments' must be a JSON object")
    return ToolCall(id=call_id, name=name.strip(), arguments=args)


_MISTRAL = "[TOOL_CALLS]"


def _mistral_calls(text: str, id_prefix: str) -> ParseResult:
    """Calls in Mistral's format: ``[TOOL_CALLS]`` and a JSON array of call objects."""
    result = ParseResult()
    body = text[text.index(_MISTRAL) + len(_MISTRAL) :].strip()
    try:
        calls, _ = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError:
        result.error = "the [TOOL_CALLS] list is not valid JSON"
        return result
    if isinstance(calls, dict):
        calls = [calls]
    try:
        result.calls = [_to_call(c, f"{id_prefix}_{i}", result.tolerated) for i, c in enumerate(calls)]
    except ValueError as exc:
        result.error, result.calls = str(exc), []
    if not result.calls and result.error is None:
        result.error = "the [TOOL_CALLS] list is empty"
    return result


def parse_tool_calls(text: str, id_prefix: str = "call") -> ParseResult:
    """Find every tool call in ``text`` (one model turn), in any of the families' formats
    (:mod:`horizonrl.toolformats`: Hermes tags, Mistral's ``[TOOL_CALLS]`` list, Llama 3's bare
    ``{"name": ..., "parameters": ...}`` object)."""
    if _MISTRAL in text:
        return _mistral_calls(text, id_prefix)
    result = ParseResult()
    opens = list(_OPEN_RE.finditer(text))
    if opens:
        if any(m.group(0) != TOOL_CALL_OPEN for m in opens):
            result.tolerated.append("tag_variant")
        blocks = []
        for i, m in enumerate(opens):
            end = opens[i + 1].start() if i + 1 < len(opens) else len(text)
            segment = text[m.end() : end]
            close = _CLOSE_RE.search(segment)
            if close:
                segment = segment[: close.start()]
            else:
                result.tolerated.append("missing_close_tag")
            blocks.append(segment)
    else:
        # No tags: accept a bare object only when it clearly is a call (has "name" and arguments).
        stripped = _FENCE_RE.sub(lambda m: m.group(1), text)
        if not re.search(r"[\"']name[\"']\s*:", stripped) or not any(k in stripped for k in _ARG_KEYS):
            result.error = "no tool call found"
            return result
        result.tolerated.append("missing_tags")
        blocks = [stripped]
    for i, block in enumerate(blocks):
        try:
            obj = _load_object(block, result.tolerated)
            result.calls.append(_to_call(obj, f"{id_prefix}_{i}", result.tolerated))
        except ValueError as exc:
            result.error = str(exc)
            result.calls = []
            return result
    return result


_HOW = {
    "hermes": "For each function call, write a JSON object with the function name and arguments within "
    "<tool_call></tool_call> tags",
    "llama3_json": 'To call a function, reply with only a JSON object {"name": ..., "parameters": ...}',
    "mistral": "To call functions, write [TOOL_CALLS] followed by a JSON list of objects with the function "
    "name and arguments",
}


def format_instructions(tools: list[ToolSpec], fmt: str = "hermes") -> str:
    """The system-prompt section that lists the tools and shows the call format ``fmt`` (a name from
    :data:`horizonrl.toolformats.FORMATS`).

    Used where the tokenizer's chat template has no tool support of its own.
    """
    specs = "\n".join(json.dumps(t.to_openai(), ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to do the task. The functions are given as JSON "
        f"schemas within <tools></tools> tags:\n<tools>\n{specs}\n</tools>\n\n"
        f"{_HOW[tool_format(fmt).name]}, for example:\n{example_call(tools, fmt)}"
    )


def example_call(tools: list[ToolSpec], fmt: str = "hermes") -> str:
    """A well-formed call of the first tool in format ``fmt``, with placeholder values for its
    required arguments."""
    family = tool_format(fmt)
    if not tools:
        return family.render([("tool_name", {"argument": "value"})])
    spec = tools[0]
    props = spec.parameters.get("properties", {})
    placeholders = {"string": "...", "integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}
    args = {
        name: placeholders.get(prop.get("type", "string"), "...")
        for name, prop in props.items()
        if name in spec.parameters.get("required", list(props))
    }
    return family.render([(spec.name, args)])


def malformed_feedback(error: str, tools: list[ToolSpec], fmt: str = "hermes") -> str:
    """The observation sent back when a turn has no readable tool call: what went wrong and the
    valid format, so the model can correct itself on the next turn."""
    names = ", ".join(t.name for t in tools)
    return (
        f"Error: {error}. Every reply must call a tool ({names}) in exactly this format:\n"
        f"{example_call(tools, fmt)}"
    )
