"""Tool-call parsing: the canonical format and the variations small models produce."""

import json

import pytest

from horizonrl.envs.calc import CalcEnv
from horizonrl.toolcalls import (
    example_call,
    format_instructions,
    format_tool_call,
    malformed_feedback,
    parse_tool_calls,
)

CALC = next(t for t in CalcEnv().tools if t.name == "calculator")


def test_round_trip_of_canonical_format():
    text = "Let me compute.\n" + format_tool_call("calculator", {"expression": "12 * 7"})
    result = parse_tool_calls(text)
    assert result.ok and result.tolerated == []
    assert [(c.name, c.arguments) for c in result.calls] == [("calculator", {"expression": "12 * 7"})]


@pytest.mark.parametrize(
    ("text", "note"),
    [
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}', "missing_close_tag"),
        ('<toolcall>{"name": "calculator", "arguments": {"expression": "1+1"}}</toolcall>', "tag_variant"),
        (
            '<tool_call>\n```json\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n```\n'
            "</tool_call>",
            "code_fence",
        ),
        (
            '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}</tool_call>',
            "arguments_as_string",
        ),
        (
            '<tool_call>{"name": "calculator", "parameters": {"expression": "1+1"}}</tool_call>',
            "key_parameters",
        ),
        (
            '<tool_call>{"function": {"name": "calculator", "arguments": {"expression": "1+1"}}}</tool_call>',
            "openai_shape",
        ),
        (
            "<tool_call>{'name': 'calculator', 'arguments': {'expression': '1+1'}}</tool_call>",
            "python_literal",
        ),
        (
            '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1",},}</tool_call>',
            "trailing_comma",
        ),
        (
            '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}} and more</tool_call>',
            "trailing_text",
        ),
        ('```json\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n```', "missing_tags"),
    ],
)
def test_tolerated_variations(text, note):
    result = parse_tool_calls(text)
    assert result.ok, result.error
    assert result.calls[0].name == "calculator"
    assert result.calls[0].arguments == {"expression": "1+1"}
    assert note in result.tolerated


def test_python_literals_come_out_as_json_values():
    result = parse_tool_calls("<tool_call>{'name': 'f', 'arguments': {'xs': (1, 2), 3: None}}</tool_call>")
    assert result.ok and result.calls[0].arguments == {"xs": [1, 2], "3": None}
    json.dumps(result.calls[0].model_dump())  # what the trajectory record writes


def test_multiple_calls_get_distinct_ids():
    text = format_tool_call("a", {}) + "\n" + format_tool_call("b", {"x": 1})
    result = parse_tool_calls(text, id_prefix="call_3")
    assert [c.name for c in result.calls] == ["a", "b"]
    assert [c.id for c in result.calls] == ["call_3_0", "call_3_1"]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("The answer is 42.", "no tool call found"),
        ("<tool_call>calculator 1+1</tool_call>", "no JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', "no 'name'"),
        ('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>', "not valid JSON"),
        # Python literals JSON cannot carry (a model wrote a set once; the trajectory record then
        # could not be written and the run stopped)
        ("<tool_call>{'name': 'book', 'arguments': {'offer_id': {'P4'}}}</tool_call>", "such as a set"),
        ("<tool_call>{'name': 'book', 'arguments': {'ids': b'P4'}}</tool_call>", "such as a set"),
        ("<tool_call>{'name': 'book', 'arguments': {(1, 2): 'x'}}</tool_call>", "such as a set"),
    ],
)
def test_malformed_calls_explain_the_problem(text, error):
    result = parse_tool_calls(text)
    assert not result.ok
    assert error in result.error


def test_feedback_shows_valid_format_with_the_env_tool():
    feedback = malformed_feedback("no tool call found", [CALC])
    assert "no tool call found" in feedback
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "..."}}\n</tool_call>' in feedback
    assert parse_tool_calls(example_call([CALC])).ok


def test_instructions_list_tools_as_json_schemas():
    text = format_instructions([CALC])
    assert '"name": "calculator"' in text and "<tools>" in text and "<tool_call>" in text


def test_pathological_input_does_not_raise():
    for text in ["<tool_call>" * 50, "{" * 5000, "<tool_call>{'a': " + "[" * 3000, "\x00\xff<tool_call>"]:
        result = parse_tool_calls(text)
        assert not result.ok
