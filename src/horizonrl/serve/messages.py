"""From an OpenAI request's messages and tools to HorizonRL's :class:`Message` and :class:`ToolSpec`,
with OpenAI's ordering rules checked; and from a model turn's text back to an assistant message.

An assistant turn's text keeps its tool-call markup in HorizonRL's messages (re-rendering the
conversation then reproduces what the model wrote); the message a client receives has the markup
taken out of ``content`` and the calls in ``tool_calls``, as OpenAI returns them. A client that
sends such a message back gets the markup restored in the canonical format
(:func:`horizonrl.toolcalls.format_tool_call`) unless its session already holds the turn.
"""

from __future__ import annotations

import json
from typing import Any

from horizonrl.asgi import JSONInputError, load_json
from horizonrl.serve.protocol import (
    AssistantMessage,
    ChatMessageIn,
    FunctionCallOut,
    NamedToolChoice,
    ToolCallOut,
    ToolDef,
    bad_request,
)
from horizonrl.toolcalls import TOOL_CALL_OPEN, format_tool_call, parse_tool_calls
from horizonrl.types import Message, ToolCall, ToolSpec


def tool_specs(tools: list[ToolDef] | None, choice: Any) -> list[ToolSpec]:
    """The tools the model is shown: none for ``tool_choice: "none"``, only the named one for a named
    choice, else all (``required`` and a named choice are enforced by a constraint:
    :mod:`horizonrl.serve.structured`)."""
    if not tools or choice == "none":
        return []
    specs = [
        ToolSpec(name=t.function.name, description=t.function.description, parameters=t.function.parameters)
        for t in tools
    ]
    if isinstance(choice, NamedToolChoice):
        specs = [s for s in specs if s.name == choice.function.get("name")]
    return specs


def _arguments(call_id: str, raw: str) -> dict[str, Any]:
    try:
        value = load_json(raw, "the arguments") if raw.strip() else {}
    except JSONInputError as exc:
        raise bad_request(
            f"tool call {call_id!r}: 'arguments' must be a JSON object encoded as a string ({exc})",
            param="messages",
        ) from None
    if not isinstance(value, dict):
        raise bad_request(f"tool call {call_id!r}: 'arguments' must encode a JSON object", param="messages")
    return value


def to_messages(items: list[ChatMessageIn]) -> list[Message]:
    """The request's messages as HorizonRL messages, checked as OpenAI checks them: a ``tool``
    message answers a call of the assistant message before it, every call of an assistant message
    is answered before the conversation goes on, and the last message is not the assistant's."""
    out: list[Message] = []
    open_calls: dict[str, str] = {}  # ids of the last assistant message's calls not yet answered
    for i, item in enumerate(items):
        role = "system" if item.role == "developer" else item.role
        if role != "tool" and open_calls:
            raise bad_request(
                "an assistant message with 'tool_calls' must be followed by tool messages answering each "
                f"'tool_call_id'; messages[{i}] ({item.role}) comes before answers to {sorted(open_calls)}",
                param=f"messages[{i}]",
            )
        text = item.text()
        if role == "tool":
            if item.tool_call_id is None:
                raise bad_request(
                    f"messages[{i}]: a tool message needs 'tool_call_id'", param=f"messages[{i}]"
                )
            if item.tool_call_id not in open_calls:
                raise bad_request(
                    f"messages[{i}]: a message with role 'tool' must answer a call of the preceding "
                    f"assistant message's 'tool_calls'; {item.tool_call_id!r} is not one of them",
                    param=f"messages[{i}]",
                )
            name = open_calls.pop(item.tool_call_id)
            out.append(
                Message(role="tool", content=text, tool_call_id=item.tool_call_id, name=item.name or name)
            )
        elif role == "assistant":
            calls = [
                ToolCall(id=c.id, name=c.function.name, arguments=_arguments(c.id, c.function.arguments))
                for c in item.tool_calls or []
            ]
            if calls and TOOL_CALL_OPEN not in text:
                markup = "\n".join(format_tool_call(c.name, c.arguments) for c in calls)
                text = f"{text}\n{markup}" if text else markup
            open_calls = {c.id: c.name for c in calls}
            out.append(Message(role="assistant", content=text, tool_calls=calls or None))
        else:
            out.append(Message(role=role, content=text, name=item.name))
    if open_calls:
        raise bad_request(
            f"the last assistant message's tool calls {sorted(open_calls)} have no tool messages "
            "answering them",
            param="messages",
        )
    if out[-1].role == "assistant":
        raise bad_request(
            "the last message must be from the user, a tool or the system (this server does not continue "
            "an assistant message)",
            param="messages",
        )
    return out


def assistant_turn(
    text: str, with_tools: bool, call_prefix: str, max_calls: int | None = None
) -> tuple[Message, AssistantMessage]:
    """A model turn's text as HorizonRL's assistant message (markup kept) and as the message a
    client receives (markup taken out of ``content``, calls in ``tool_calls``). ``max_calls``
    (``parallel_tool_calls: false``): only the first calls count, in both messages (the text keeps
    what the model wrote)."""
    calls = parse_tool_calls(text, id_prefix=call_prefix).calls if with_tools else []
    if max_calls is not None:
        calls = calls[:max_calls]
    internal = Message(role="assistant", content=text, tool_calls=calls or None)
    if not calls:
        return internal, AssistantMessage(content=text)
    cut = text.find(TOOL_CALL_OPEN)
    content = text[:cut].rstrip() if cut >= 0 else ""
    out = [
        ToolCallOut(
            id=c.id,
            function=FunctionCallOut(name=c.name, arguments=json.dumps(c.arguments, ensure_ascii=False)),
        )
        for c in calls
    ]
    return internal, AssistantMessage(content=content or None, tool_calls=out)


def same_turn(sent: Message, kept: Message) -> bool:
    """Whether a message a client sent back is the turn a session holds (by role, tool calls and
    content: the client may send either the text with markup or the content without it)."""
    if sent.role != kept.role:
        return False
    if kept.role != "assistant":
        return sent.content == kept.content and (sent.tool_call_id or None) == (kept.tool_call_id or None)
    sent_calls = [(c.name, c.arguments) for c in sent.tool_calls or []]
    kept_calls = [(c.name, c.arguments) for c in kept.tool_calls or []]
    if sent_calls != kept_calls:
        return False
    if sent.content.strip() == kept.content.strip():
        return True
    cut = kept.content.find(TOOL_CALL_OPEN)
    visible = kept.content[:cut] if cut >= 0 else kept.content
    return sent.content.split(TOOL_CALL_OPEN)[0].strip() == visible.strip()
