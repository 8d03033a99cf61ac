"""Structured outputs through a real ``horizon serve`` (tiny random model: only the constraint makes
its replies valid): ``response_format`` json_object / json_schema, ``tool_choice`` required and
named, strict tools, vLLM's ``structured_outputs`` on chat and text completions, streaming, the
official client's ``parse``, ``engine.kind: openai`` passing a constraint on, a role's
``structured`` reply, and every bad request refused with a 400 naming the field."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from horizonrl.engine.base import SamplingParams
from horizonrl.engine.constraints import Constraint, ConstraintError
from horizonrl.errors import HorizonError
from horizonrl.serve.server import serve_in_subprocess

TOKEN = "structured-token"
MODEL = "structured"
USER = [{"role": "user", "content": "Describe a pet as JSON."}]
SCHEMAS = [
    {  # nested object, enum, bounded array
        "type": "object",
        "properties": {
            "pet": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,7}$"},
                    "kind": {"enum": ["cat", "dog", "fish"]},
                },
                "required": ["name", "kind"],
                "additionalProperties": False,
            },
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
        },
        "required": ["pet", "tags"],
        "additionalProperties": False,
    },
    {  # numbers with ranges
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 0, "maximum": 30},
            "weight": {"type": "number", "minimum": 0.5, "maximum": 9.5},
        },
        "required": ["age", "weight"],
        "additionalProperties": False,
    },
    {  # strings with patterns and a boolean
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
            "ok": {"type": "boolean"},
        },
        "required": ["code", "ok"],
        "additionalProperties": False,
    },
    {  # an array of objects
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9}},
            "required": ["x"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 4,
    },
]
CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "pattern": "^[0-9+*-]{1,9}$"}},
            "required": ["expression"],
            "additionalProperties": False,
        },
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (CALC, WEATHER)}


def _json_schema(schema: dict, name: str = "reply") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest.fixture(scope="module")
def server():
    overrides = ["model.path=tiny-random", f"name={MODEL}", "model.dtype=float32", "engine.dtype=float32"]
    with serve_in_subprocess("configs/calc.yaml", overrides, token=TOKEN) as (url, _proc):
        yield url


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=TOKEN, max_retries=0, timeout=120)


def test_24_json_schema_replies_across_schemas_are_all_valid(client):
    def ask(i: int) -> tuple[dict, str, str]:
        schema = SCHEMAS[i % len(SCHEMAS)]
        reply = client.chat.completions.create(
            model=MODEL, messages=USER, response_format=_json_schema(schema), max_tokens=200, seed=i
        )
        return schema, reply.choices[0].message.content, reply.choices[0].finish_reason

    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        replies = list(pool.map(ask, range(24)))
    for schema, text, finish in replies:
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), schema)
    # any JSON object: its keys are unbounded strings, which a random model seldom closes, so a
    # reply is a JSON object or (finish "length") the start of one
    objects = client.chat.completions.create(
        model=MODEL, messages=USER, response_format={"type": "json_object"}, max_tokens=30, n=4, seed=3
    ).choices
    for c in objects:
        assert c.message.content.startswith("{")
        assert c.finish_reason == "length" or isinstance(json.loads(c.message.content), dict)


def test_a_constrained_reply_cut_by_max_tokens_finishes_with_length(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=USER, response_format=_json_schema(SCHEMAS[0]), max_tokens=3, seed=1
    )
    assert reply.choices[0].finish_reason == "length"


def test_streaming_a_json_schema_reply_concatenates_to_valid_json(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=USER,
            response_format=_json_schema(SCHEMAS[1]),
            max_tokens=120,
            seed=5,
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), SCHEMAS[1])
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "stop"
    ]


def _check_calls(choice, names: set[str]) -> list[str]:
    assert choice.finish_reason == "tool_calls", choice.message
    called = []
    for call in choice.message.tool_calls:
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), TOOL_SCHEMAS[call.function.name])
        called.append(call.function.name)
    return called


def _concurrently(client, requests: list[dict]) -> list:
    def ask(kwargs: dict):
        return client.chat.completions.create(model=MODEL, messages=USER, **kwargs).choices[0]

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(ask, requests))


def test_tool_choice_required_and_named_are_enforced(client):
    both = {"tools": [CALC, WEATHER], "max_tokens": 150}
    named = {"type": "function", "function": {"name": "weather"}}
    required = [{**both, "tool_choice": "required", "seed": s} for s in range(3)]
    single = [{**r, "parallel_tool_calls": False} for r in required]
    one_named = [{**both, "tool_choice": named, "seed": s} for s in range(3)]
    replies = _concurrently(client, required + single + one_named)
    for reply in replies[:3]:
        assert _check_calls(reply, {"calculator", "weather"})
    for reply in replies[3:6]:
        assert len(_check_calls(reply, {"calculator", "weather"})) == 1
    for reply in replies[6:]:
        assert _check_calls(reply, {"weather"}) == ["weather"]
    streamed = list(
        client.chat.completions.create(
            model=MODEL, messages=USER, tools=[WEATHER], tool_choice="required", max_tokens=150, stream=True
        )
    )
    calls = [tc for c in streamed if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [c.function.name for c in calls][:1] == ["weather"]
    assert streamed[-1].choices[0].finish_reason == "tool_calls"


def test_auto_with_a_strict_tool_or_a_json_answer_keeps_calls_valid(client):
    strict = json.loads(json.dumps(WEATHER))
    strict["function"]["strict"] = True
    prose_or_calls = [{"tools": [strict], "max_tokens": 40, "seed": s} for s in range(3)]
    json_or_calls = [
        {"tools": [CALC], "response_format": _json_schema(SCHEMAS[2]), "max_tokens": 150, "seed": s}
        for s in range(3)
    ]
    replies = _concurrently(client, prose_or_calls + json_or_calls)
    for reply in replies[:3]:
        if reply.message.tool_calls:
            _check_calls(reply, {"weather"})
        else:
            assert "<" not in (reply.message.content or "")
    for reply in replies[3:]:
        if reply.message.tool_calls:
            _check_calls(reply, {"calculator"})
        else:
            assert reply.finish_reason == "stop"
            jsonschema.validate(json.loads(reply.message.content), SCHEMAS[2])


def test_structured_outputs_on_chat_and_text_completions(client):
    chat = client.chat.completions.create(
        model=MODEL,
        messages=USER,
        max_tokens=20,
        extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}},
    )
    assert chat.choices[0].message.content in ("yes", "no", "maybe")
    text = client.completions.create(
        model=MODEL,
        prompt="Order number:",
        max_tokens=30,
        n=4,
        seed=2,
        extra_body={"structured_outputs": {"regex": r"[A-Z]{2}[0-9]{4}"}},
    )
    assert all(re.fullmatch(r"[A-Z]{2}[0-9]{4}", c.text) for c in text.choices), text.choices


class Pet(BaseModel):
    name: str = Field(pattern="^[A-Z][a-z]{1,7}$")
    kind: Literal["cat", "dog"]
    age: int = Field(ge=0, le=30)


def test_the_official_clients_parse_returns_a_validated_object(client):
    parsers = [client.chat.completions]
    if hasattr(getattr(client, "beta", None), "chat"):
        parsers.append(client.beta.chat.completions)
    for completions in parsers:
        reply = completions.parse(model=MODEL, messages=USER, response_format=Pet, max_tokens=120, seed=4)
        assert isinstance(reply.choices[0].message.parsed, Pet)


async def test_a_roles_structured_reply_from_horizon_serve_is_valid(server, monkeypatch):
    from horizonrl.roles import Roles, RolesConfig

    monkeypatch.setenv("TEST_STRUCTURED_KEY", TOKEN)
    spec = {"backend": "openai", "base_url": f"{server}/v1", "model": MODEL}
    roles = Roles(RolesConfig.model_validate({"judge": {**spec, "api_key_env": "TEST_STRUCTURED_KEY"}}))
    reply = await roles.get("judge").structured(USER, Pet, max_tokens=120, seed=1)
    assert reply.ok and reply.enforced and isinstance(reply.value, Pet), reply.error


async def test_engine_kind_openai_passes_the_constraint_on(server, tokenizer):
    from horizonrl.engine.remote import OpenAIEngine

    engine = OpenAIEngine(f"{server}/v1", MODEL, tokenizer, api_key=TOKEN, max_context=8192)
    prompt = tokenizer("A record:", add_special_tokens=False)["input_ids"]
    eos = set(engine.eos_token_ids)
    try:
        completions = await asyncio.gather(
            *(
                engine.generate(
                    prompt,
                    SamplingParams(
                        max_new_tokens=150, seed=s, constraint=Constraint(json_schema=SCHEMAS[s % 4])
                    ),
                )
                for s in range(4)
            )
        )
        for s, c in enumerate(completions):
            text = tokenizer.decode([t for t in c.token_ids if t not in eos])
            jsonschema.validate(json.loads(text), SCHEMAS[s % 4])
            assert c.constraint_met is True and len(c.logprobs) == len(c.token_ids)
        with pytest.raises(ConstraintError, match="structured_outputs"):
            await engine.generate(prompt, SamplingParams(constraint=Constraint(regex="[a-")))
        # an endpoint that ignored the constraint is caught: free tokens do not pass as constrained
        free = await engine.generate(prompt, SamplingParams(max_new_tokens=8, seed=1))
        with pytest.raises(HorizonError, match="does not enforce structured_outputs"):
            engine._check_enforced(Constraint(json_schema=SCHEMAS[0]), free.token_ids)
    finally:
        await engine.close()


def _post(server: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(
        f"{server}/v1/{path}",
        json={"model": MODEL, "max_tokens": 4, **body},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=60,
    )


BAD = [
    ({"response_format": {"type": "xml"}}, "response_format", "'json_schema'"),
    ({"response_format": {"type": "json_object", "schema": {}}}, "response_format", "takes no"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "needs 'json_schema'"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schemas": {}}}},
        "response_format",
        "unknown keys",
    ),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format", "name"),
    ({"response_format": _json_schema({"type": "object", "properties": 5})}, "response_format", "Schema"),
    ({"response_format": _json_schema({"$ref": "#/nowhere"})}, "response_format", "nowhere"),
    (
        {"tools": [CALC], "tool_choice": {"type": "function", "function": {"name": "weather"}}},
        "tool_choice",
        "'weather'",
    ),
    ({"tool_choice": "required"}, "tool_choice", "needs at least one tool"),
    ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs", "regex"),
    ({"structured_outputs": {"xml": "<a/>"}}, "structured_outputs", "unsupported"),
    ({"structured_outputs": {}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"grammar": "start: b"}}, "structured_outputs", "does not compile"),
    (
        {"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}},
        "structured_outputs",
        "not both",
    ),
    (
        {"structured_outputs": {"choice": ["a"]}, "tools": [CALC], "tool_choice": "required"},
        "structured_outputs",
        "tool_choice",
    ),
]


@pytest.mark.parametrize(("body", "param", "says"), BAD)
def test_bad_structured_requests_are_400s_naming_the_field(server, body, param, says):
    answer = _post(server, "chat/completions", {"messages": USER, **body})
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] == param, error
    assert says in error["message"] and "\n" not in error["message"], error["message"]


def test_bad_structured_outputs_on_text_completions_is_a_400(server):
    for bad in ({"grammar": "start: b"}, {"json": "{not json"}, {"regex": "a", "choice": ["b"]}):
        answer = _post(server, "completions", {"prompt": "x", "structured_outputs": bad})
        error = answer.json()["error"]
        assert answer.status_code == 400 and error["param"] == "structured_outputs", error
        assert "\n" not in error["message"]


async def test_a_runners_session_with_forced_sampling_is_held_to_the_response_format(
    tiny_model_and_tokenizer,
):
    from horizonrl.engine.hf import HFEngine
    from horizonrl.serve.protocol import ChatCompletionRequest
    from horizonrl.serve.service import PolicyService

    model, tokenizer = tiny_model_and_tokenizer
    engine = HFEngine(model, tokenizer)
    service = PolicyService(engine, tokenizer, MODEL)
    service.sessions.open("s1", forced=SamplingParams(temperature=1.0, max_new_tokens=150, seed=3))
    request = ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": USER, "response_format": _json_schema(SCHEMAS[1])}
    )
    try:
        reply = await service.chat(request, "s1")
    finally:
        await engine.close()
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMAS[1])
    assert reply.choices[0].finish_reason == "stop"
    # the session's record marks the constrained turn, and the trainer's replay reproduces its logprobs
    from horizonrl.engine.replay import ConstraintReplay
    from horizonrl.train.logprobs import old_outputs

    traj = service.sessions.get_or_create("s1").trajectory("finished", 1.0)
    (span,) = traj.constrained
    assert traj.loss_mask[span.start : span.end] == [1] * (span.end - span.start)
    old = old_outputs(model, [traj], 0, 4096, 1.0, replay=ConstraintReplay(tokenizer, model))["old_logprobs"][
        0
    ]
    gaps = [abs(a - b) for a, b, m in zip(old, traj.logprobs, traj.loss_mask, strict=True) if m]
    assert max(gaps) < 1e-4


def test_parallel_tool_calls_false_keeps_the_first_call_in_both_messages():
    from horizonrl.serve.messages import assistant_turn
    from horizonrl.toolcalls import format_tool_call

    text = format_tool_call("calculator", {"expression": "1+1"}) + "\n"
    text += format_tool_call("weather", {"city": "Oslo", "days": 1})
    internal, out = assistant_turn(text, with_tools=True, call_prefix="c", max_calls=1)
    assert [c.function.name for c in out.tool_calls] == ["calculator"]
    assert [c.name for c in internal.tool_calls] == ["calculator"] and internal.content == text
    _, every = assistant_turn(text, with_tools=True, call_prefix="c")
    assert len(every.tool_calls) == 2
