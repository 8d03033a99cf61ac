"""Tool-call text formats per model family: how a call is written, and the grammar that holds a
model's turn to well-formed calls of given tools.

A model writes tool calls in the format its chat template was tuned on:

- ``hermes`` (Hermes, Qwen 2/2.5/3, and templates without tool support of their own, where the
  tools and this format go into the system prompt)::

      <tool_call>
      {"name": "calculator", "arguments": {"expression": "12 * 7"}}
      </tool_call>

- ``llama3_json`` (Llama 3.1-3.3's JSON tool calling): the reply is one object
  ``{"name": "calculator", "parameters": {"expression": "12 * 7"}}``.
- ``mistral`` (Mistral's templates): ``[TOOL_CALLS][{"name": "calculator", "arguments": {...}}]``.

:func:`detect` reads the format off a chat template; a template that names none has no tool support,
and the caller chooses (the agent puts the tools and the ``hermes`` format into the system prompt,
and says so). A new family is one more :class:`ToolCallFormat` in :data:`FORMATS`.

:meth:`ToolCallFormat.grammar` writes a grammar in llguidance's Lark dialect (``%json`` embeds a JSON
schema) that admits exactly the calls of the given tools whose arguments satisfy the tools' own JSON
schemas, written compactly as :func:`json.dumps` writes them (one space after ``,`` and ``:``, no
other white space: a small model left free to add white space can loop on it). With ``text`` the
reply may instead be prose, or prose followed by calls; prose then holds no ``<`` (for ``hermes``, the
``<`` that opens a call is where prose ends: the grammar's lexer must know where a word stops).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from horizonrl.types import ToolSpec

#: JSON written as json.dumps writes it (llguidance's JSON compile options, per embedded schema)
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def compact(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with llguidance's options for compact JSON (a user's own ``x-guidance`` wins)."""
    return {**schema, "x-guidance": {**COMPACT_JSON, **schema.get("x-guidance", {})}}


@dataclass(frozen=True)
class ToolCallFormat:
    """One family's way of writing tool calls (see the module doc)."""

    name: str
    #: the key holding a call's arguments
    arguments_key: str
    #: text before the first call and after the last, and between two calls
    open: str
    close: str
    separator: str
    #: the calls are one JSON array (mistral) rather than one object each
    array: bool = False

    def call_schema(self, tool: ToolSpec) -> dict[str, Any]:
        """The JSON schema of one call of ``tool``: its name and its arguments."""
        return {
            "type": "object",
            "properties": {"name": {"const": tool.name}, self.arguments_key: tool.parameters},
            "required": ["name", self.arguments_key],
            "additionalProperties": False,
        }

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        """The text of ``calls`` ((name, arguments) pairs) as a model of this family writes them."""
        objects = [
            json.dumps({"name": name, self.arguments_key: args}, ensure_ascii=False) for name, args in calls
        ]
        if self.array:
            return f"{self.open}[{', '.join(objects)}]{self.close}"
        return self.separator.join(f"{self.open}{o}{self.close}" for o in objects)

    def grammar(self, tools: list[ToolSpec], *, parallel: bool = False, text: bool = False) -> str:
        """A Lark grammar (llguidance's dialect) admitting one call of one of ``tools`` (``parallel``:
        one or more), or with ``text`` also prose, alone or before the calls."""
        if not tools:
            raise ValueError("a tool-call constraint needs at least one tool")
        one = (
            {"anyOf": [self.call_schema(t) for t in tools]} if len(tools) > 1 else self.call_schema(tools[0])
        )
        if self.array:
            items: dict[str, Any] = {"type": "array", "items": one, "minItems": 1}
            if not parallel:
                items["maxItems"] = 1
            rules = [f"calls: {_lit(self.open)} %json {json.dumps(compact(items))} {_lit(self.close)}"]
        else:
            block = " ".join(x for x in (_lit(self.open), "call", _lit(self.close)) if x)
            rules = [f"block: {block}", f"call: %json {json.dumps(compact(one))}"]
            rules.append(f"calls: block ({_lit(self.separator)} block)*" if parallel else "calls: block")
        if text:
            first = (self.open or "{")[0]
            prose = _regex_excluding(first)
            rules.insert(0, "start: PROSE | PROSE? calls")
            rules.append(f"PROSE: /{prose}/")
        else:
            rules.insert(0, "start: calls")
        return "\n".join(rules) + "\n"


def _lit(text: str) -> str:
    """``text`` as a Lark string literal (empty: nothing)."""
    return json.dumps(text) if text else ""


def _regex_excluding(char: str) -> str:
    """A regex of one or more characters, none of them ``char``."""
    escaped = "\\" + char if char in "\\]^-[" else char
    return f"[^{escaped}]+"


FORMATS: dict[str, ToolCallFormat] = {
    "hermes": ToolCallFormat("hermes", "arguments", "<tool_call>\n", "\n</tool_call>", "\n"),
    "llama3_json": ToolCallFormat("llama3_json", "parameters", "", "", "; "),
    "mistral": ToolCallFormat("mistral", "arguments", "[TOOL_CALLS]", "", "", array=True),
}


def tool_format(name: str) -> ToolCallFormat:
    """The format called ``name``; ValueError naming the valid ones otherwise."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call format {name!r}; valid: {', '.join(FORMATS)}") from None


def detect(chat_template: str) -> str | None:
    """The tool-call format a chat template writes, or None when it has no tool support."""
    if "[TOOL_CALLS]" in chat_template:
        return "mistral"
    if "<tool_call>" in chat_template:
        return "hermes"
    if "<|python_tag|>" in chat_template or ("ipython" in chat_template and '"parameters"' in chat_template):
        return "llama3_json"
    return None
