"""The policy server's wire format without a server: OpenAI request validation, message ordering
rules, turning a model turn into an assistant message, recognising an echoed turn, and what part
of a growing turn may be streamed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from horizonrl.serve.chat_completions import _safe_prefix
from horizonrl.serve.messages import assistant_turn, same_turn, to_messages, tool_specs
from horizonrl.serve.protocol import APIError, ChatCompletionRequest, CompletionRequest, validation_error
from horizonrl.types import Message

CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


def _request(**fields):
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def _error(exc: ValidationError) -> APIError:
    return validation_error(exc)


def test_unknown_field_is_refused_as_openai_does():
    with pytest.raises(ValidationError) as info:
        _request(temperature_typo=0.5)
    err = _error(info.value)
    assert err.status == 400
    assert err.message == "Unrecognized request argument supplied: temperature_typo"
    assert err.param == "temperature_typo"


def test_known_openai_fields_that_do_not_change_tokens_are_accepted():
    req = _request(user="u1", store=False, metadata={"a": "b"}, parallel_tool_calls=True, service_tier="auto")
    req.check_neutral()  # nothing raised


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"presence_penalty": 1.0}, "presence_penalty"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ],
)
def test_output_changing_fields_that_are_not_implemented_are_refused_by_name(fields, param):
    with pytest.raises(APIError) as info:
        _request(**fields).check_neutral()
    assert info.value.status == 400 and info.value.param == param and param in info.value.message


def test_a_tool_schema_that_is_not_json_schema_is_refused():
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": 5}}}
    with pytest.raises(ValidationError) as info:
        _request(tools=[bad])
    err = _error(info.value)
    assert err.status == 400 and "not a valid JSON Schema" in err.message and "tools" in (err.param or "")


def test_tool_parameters_must_be_an_object_schema():
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}
    with pytest.raises(ValidationError) as info:
        _request(tools=[bad])
    assert "type 'object'" in _error(info.value).message


def test_sampling_bounds_name_the_field():
    with pytest.raises(ValidationError) as info:
        _request(temperature=3.0)
    err = _error(info.value)
    assert err.param == "temperature" and "less than or equal to 2" in err.message
    with pytest.raises(ValidationError):
        _request(stop=["a", "b", "c", "d", "e"])
    with pytest.raises(ValidationError) as info:
        _request(top_logprobs=2)
    assert "needs logprobs" in _error(info.value).message


def test_named_tool_choice_must_name_a_tool():
    with pytest.raises(ValidationError):
        _request(tools=[CALC], tool_choice={"type": "function", "function": {"name": "other"}})
    req = _request(tools=[CALC], tool_choice={"type": "function", "function": {"name": "calculator"}})
    assert [t.name for t in tool_specs(req.tools, req.tool_choice)] == ["calculator"]
    assert tool_specs(req.tools, "none") == []


def test_completion_request_prompt_shapes():
    assert CompletionRequest(model="m", prompt="hi").prompts() == ["hi"]
    assert CompletionRequest(model="m", prompt=[1, 2, 3]).prompts() == [[1, 2, 3]]
    assert CompletionRequest(model="m", prompt=["a", "b"]).prompts() == ["a", "b"]
    with pytest.raises(APIError, match="echo"):
        CompletionRequest(model="m", prompt="x", echo=True).check_neutral()


def _msgs(*items):
    return ChatCompletionRequest.model_validate({"model": "m", "messages": list(items)}).messages


CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'},
}


def test_messages_convert_with_tool_call_markup_restored():
    out = to_messages(
        _msgs(
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "what is "}, {"type": "text", "text": "1+1"}],
            },
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "2"},
        )
    )
    assert [m.role for m in out] == ["system", "user", "assistant", "tool"]
    assert out[1].content == "what is 1+1"
    assert (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'
        in out[2].content
    )
    assert out[2].tool_calls[0].arguments == {"expression": "1+1"}
    assert out[3].name == "calculator" and out[3].tool_call_id == "c1"


@pytest.mark.parametrize(
    ("items", "fragment"),
    [
        ([{"role": "tool", "tool_call_id": "c1", "content": "2"}], "must answer a call"),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [CALL]},
                {"role": "user", "content": "and?"},
            ],
            "must be followed by tool messages",
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [CALL]}],
            "have no tool messages answering them",
        ),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "the last message"),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [CALL]},
                {"role": "tool", "content": "2"},
            ],
            "needs 'tool_call_id'",
        ),
    ],
)
def test_messages_out_of_order_are_refused(items, fragment):
    with pytest.raises(APIError) as info:
        to_messages(_msgs(*items))
    assert info.value.status == 400 and fragment in info.value.message


def test_tool_call_arguments_must_be_a_json_object():
    bad = {**CALL, "function": {"name": "calculator", "arguments": "{not json"}}
    with pytest.raises(APIError, match="JSON object encoded as a string"):
        to_messages(
            _msgs(
                {"role": "user", "content": "q"},
                {"role": "assistant", "tool_calls": [bad]},
                {"role": "tool", "tool_call_id": "c1", "content": "x"},
            )
        )


def test_assistant_turn_splits_markup_from_content_and_same_turn_recognises_the_echo():
    text = (
        "First, I compute 2 * 3.\n<tool_call>\n"
        '{"name": "calculator", "arguments": {"expression": "2 * 3"}}\n</tool_call>'
    )
    internal, out = assistant_turn(text, with_tools=True, call_prefix="call_x")
    assert internal.content == text and internal.tool_calls[0].name == "calculator"
    assert out.content == "First, I compute 2 * 3." and out.tool_calls[0].function.name == "calculator"
    echoed = to_messages(
        _msgs(
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": out.content,
                "tool_calls": [c.model_dump() for c in out.tool_calls],
            },
            {"role": "tool", "tool_call_id": out.tool_calls[0].id, "content": "6"},
        )
    )[1]
    assert same_turn(echoed, internal)
    other = echoed.model_copy(update={"content": "Something else.\n<tool_call>x</tool_call>"})
    assert not same_turn(other, internal)
    assert not same_turn(Message(role="assistant", content=text), internal)  # calls missing
    plain, plain_out = assistant_turn("no call here", with_tools=True, call_prefix="c")
    assert plain_out.tool_calls is None and plain_out.content == "no call here" and plain.tool_calls is None
    _, without_tools = assistant_turn(text, with_tools=False, call_prefix="c")
    assert without_tools.tool_calls is None and without_tools.content == text


def test_streaming_holds_back_what_may_become_a_tool_call():
    assert _safe_prefix("Hello wor", with_tools=False) == "Hello wor"
    assert _safe_prefix("Hello \ufffd", with_tools=False) == "Hello "
    assert _safe_prefix("First, I compute.\n<tool", with_tools=True) == "First, I compute."
    assert _safe_prefix("First.\n<tool_call>\n{", with_tools=True) == "First."
    assert _safe_prefix("a < b", with_tools=True) == "a < b"
