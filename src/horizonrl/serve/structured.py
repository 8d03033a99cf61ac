"""Structured outputs of ``horizon serve``: from a request's ``response_format``, ``tool_choice``,
tools marked ``strict`` and vLLM's ``structured_outputs`` to the one
:class:`~horizonrl.engine.constraints.Constraint` the engine holds each choice to.

Chat completions:

- ``response_format`` ``json_object`` (any JSON object) or ``json_schema`` (``strict`` true or
  false: the schema is enforced either way) holds the reply to the schema;
- ``tool_choice: "required"`` holds the reply to calls of the request's tools (one or more; exactly
  one with ``parallel_tool_calls: false``), a named function to exactly one call of that function,
  each with arguments valid under the tool's schema, written in the ``hermes`` format the server
  parses;
- ``tool_choice: "auto"`` (the default with tools) stays free text, unless a tool is marked
  ``strict`` (then the reply is prose, or prose followed by calls whose arguments are valid under
  their tools' schemas; the prose holds no ``<``, where a call opens) or ``response_format`` asks
  for JSON (then the reply is the JSON answer or calls);
- ``structured_outputs`` (vLLM's ``json``, ``json_object``, ``regex``, ``choice``, ``grammar``)
  holds the whole reply, and is refused together with a JSON ``response_format`` or a forced
  tool call.

With ``parallel_tool_calls: false`` a reply keeps at most its first call. A constraint is checked
(schema, regex, grammar compiled without the tokenizer; cached) before anything is queued, so a bad
one is a 400 naming the field.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from horizonrl.engine.base import Completion
from horizonrl.engine.constraints import Constraint, ConstraintError, json_schema_error, lark_of
from horizonrl.serve.protocol import APIError, ChatCompletionRequest, NamedToolChoice, bad_request
from horizonrl.toolformats import compact, tool_format
from horizonrl.types import ToolSpec

#: the tool-call format ``horizon serve`` writes into prompts and parses out of replies
SERVED_TOOL_FORMAT = "hermes"


@dataclass(frozen=True)
class ChatStructure:
    """What a chat request's choices are held to: the constraint (None: free text), the most tool
    calls a reply keeps (None: all), and the request field the constraint comes from."""

    constraint: Constraint | None = None
    max_calls: int | None = None
    param: str = "response_format"


def _one_line(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return str(exc.errors()[0].get("msg", "invalid value")).removeprefix("Value error, ")
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def from_structured_outputs(fields: dict[str, Any] | None) -> Constraint | None:
    """vLLM's ``structured_outputs`` field as a constraint; 400 naming the field when it is bad."""
    if fields is None:
        return None
    try:
        constraint = Constraint.from_structured_outputs(fields)
    except (ValueError, TypeError) as exc:
        raise bad_request(f"structured_outputs: {_one_line(exc)}", param="structured_outputs") from None
    return check(constraint, "structured_outputs")


def chat_structure(req: ChatCompletionRequest, tools: list[ToolSpec]) -> ChatStructure:
    """The constraint and call limit of a chat request whose model is shown ``tools`` (see the
    module doc); 400 naming the field for a bad or contradictory request."""
    answer = req.answer_schema
    raw = from_structured_outputs(req.structured_outputs)
    choice = req.tool_choice
    forced = tools and (choice == "required" or isinstance(choice, NamedToolChoice))
    if raw is not None and answer is not None:
        raise bad_request(
            "set either response_format (json_object or json_schema) or structured_outputs, not both",
            param="structured_outputs",
        )
    if raw is not None and forced:
        raise bad_request(
            "structured_outputs cannot be combined with tool_choice 'required' or a named function",
            param="structured_outputs",
        )
    if answer is not None:
        error = json_schema_error(answer)
        if error:
            raise bad_request(
                f"response_format: json_schema.schema is not a valid JSON Schema: {error}",
                param="response_format",
            )
    parallel = req.parallel_tool_calls is not False
    if not tools:
        if raw is not None:
            return ChatStructure(raw, param="structured_outputs")
        if answer is None:
            return ChatStructure()
        return ChatStructure(check(Constraint(json_schema=answer), "response_format"))
    if isinstance(choice, NamedToolChoice):
        named = tuple(t for t in tools if t.name == choice.function.get("name"))
        return ChatStructure(check(_calls(named, parallel=False), "tool_choice"), 1, "tool_choice")
    limit = None if parallel else 1
    if choice == "required":
        required = _calls(tuple(tools), parallel=parallel)
        return ChatStructure(check(required, "tool_choice"), limit, "tool_choice")
    if raw is not None:
        return ChatStructure(raw, limit, "structured_outputs")
    if answer is not None:
        grammar = calls_or_json(tools, answer, parallel=parallel)
        return ChatStructure(check(Constraint(grammar=grammar), "response_format"), limit)
    if any(t.function.strict for t in req.tools or []):
        strict = _calls(tuple(tools), parallel=parallel, text=True)
        return ChatStructure(check(strict, "tools"), limit, "tools")
    return ChatStructure(None, limit)


def finish_reason(completion: Completion, called: bool) -> str:
    """A chat choice's finish reason: ``length`` for a constrained reply cut off before it was
    complete, else ``tool_calls`` when it calls tools, else the engine's."""
    if completion.constraint_met is False and completion.finish_reason == "length":
        return "length"
    return "tool_calls" if called else completion.finish_reason


def _calls(tools: tuple[ToolSpec, ...], *, parallel: bool, text: bool = False) -> Constraint:
    return Constraint(
        tools=tools, tool_format=SERVED_TOOL_FORMAT, parallel_tool_calls=parallel, allow_text=text
    )


def calls_or_json(tools: list[ToolSpec], schema: dict[str, Any], *, parallel: bool) -> str:
    """A Lark grammar admitting calls of ``tools`` (in the served format) or a JSON answer valid
    under ``schema``: what ``response_format`` with tools in ``auto`` mode holds a reply to."""
    lark = tool_format(SERVED_TOOL_FORMAT).grammar(tools, parallel=parallel)
    head, rest = lark.split("\n", 1)
    if head != "start: calls":  # pragma: no cover - the format's grammar starts this way
        raise AssertionError(f"unexpected tool-call grammar start: {head!r}")
    return f"start: calls | answer\n{rest}answer: %json {json.dumps(compact(schema))}\n"


def check(constraint: Constraint, param: str) -> Constraint:
    """``constraint`` after checking that it compiles (without the tokenizer: schema, regex and
    grammar); 400 naming ``param`` otherwise."""
    problem = _problem(constraint.key())
    if problem:
        raise bad_request(f"{param}: {problem}", param=param)
    return constraint


@functools.lru_cache(maxsize=512)
def _problem(key: str) -> str | None:
    from llguidance import LLMatcher

    constraint = Constraint.model_validate(json.loads(key))
    try:
        grammar = lark_of(constraint)
    except (ConstraintError, ValueError) as exc:
        return _one_line(exc)
    error = LLMatcher.validate_grammar(grammar)
    if error and not error.startswith("WARNING"):
        return f"{constraint.describe()} does not compile: {_one_line(ValueError(error))}"
    return None


def constraint_error(exc: ConstraintError, param: str) -> APIError:
    """A constraint the engine refused (past the checks above) as a 400 naming ``param``."""
    return bad_request(f"{param}: {_one_line(exc)}", param=param)
