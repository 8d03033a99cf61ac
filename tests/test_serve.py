"""A real ``horizon serve`` process on loopback (tiny random model, the real SmolLM2 tokenizer and
chat template) driven by the official ``openai`` client: models, chat with tools, n > 1, logprobs,
seeds, streaming, text completions, 32 concurrent clients batched by the engine, and errors in
OpenAI's shape."""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import openai
import pytest

from horizonrl.serve.server import serve_in_subprocess

TOKEN = "test-token"
CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
USER = [{"role": "user", "content": "What is 12 times 7?"}]


@pytest.fixture(scope="module")
def server():
    overrides = ["model.path=tiny-random", "name=calc", "sampling.max_new_tokens=24", "model.dtype=float32"]
    with serve_in_subprocess("configs/calc.yaml", overrides, token=TOKEN) as (url, _proc):
        yield url


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=TOKEN, max_retries=0, timeout=120)


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["calc"]
    assert client.models.retrieve("calc").id == "calc"


def test_chat_with_tools_n_and_logprobs(client):
    reply = client.chat.completions.create(
        model="calc", messages=USER, tools=[CALC], n=3, max_tokens=6, logprobs=True, top_logprobs=3, seed=7
    )
    assert [c.index for c in reply.choices] == [0, 1, 2]
    entries = [c.logprobs.content for c in reply.choices]
    assert reply.usage.completion_tokens == sum(len(e) for e in entries)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    for choice, tokens in zip(reply.choices, entries, strict=True):
        assert 1 <= len(tokens) <= 6
        assert choice.finish_reason in ("stop", "length")
        for t in tokens:
            assert len(t.top_logprobs) == 3
            assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
            assert t.logprob <= t.top_logprobs[0].logprob + 1e-5
    assert reply.model_extra["horizon"]["policy_version"] == 0


def test_a_seed_reproduces_the_completion(client):
    def ask(seed: int) -> str:
        r = client.chat.completions.create(
            model="calc", messages=USER, max_tokens=8, seed=seed, temperature=1.0
        )
        return r.choices[0].message.content

    assert ask(11) == ask(11)
    assert len({ask(s) for s in (1, 2, 3, 4)}) > 1


def test_streaming_gives_the_same_text_as_a_plain_answer(client):
    kwargs = {"model": "calc", "messages": USER, "max_tokens": 12, "temperature": 0}
    plain = client.chat.completions.create(**kwargs)
    chunks = list(
        client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [plain.choices[0].finish_reason]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_text_completions_of_text_and_token_prompts(client):
    reply = client.completions.create(
        model="calc", prompt="The answer is", max_tokens=5, logprobs=2, temperature=0
    )
    choice = reply.choices[0]
    assert reply.usage.completion_tokens == len(choice.logprobs.tokens) <= 5
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs)
    assert choice.logprobs.text_offset[0] == 0
    by_ids = client.completions.create(model="calc", prompt=[504, 3479, 314], max_tokens=3, temperature=0)
    assert by_ids.usage.prompt_tokens == 3


def test_32_concurrent_clients_are_batched_by_the_engine(client, server):
    before = httpx.get(f"{server}/health").json()["engine"]

    def ask(i: int) -> int:
        r = client.chat.completions.create(
            model="calc",
            messages=[{"role": "user", "content": f"Question number {i}"}],
            max_tokens=16,
            seed=i,
        )
        return r.usage.completion_tokens

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        tokens = list(pool.map(ask, range(32)))
    after = httpx.get(f"{server}/health").json()["engine"]
    assert len(tokens) == 32 and all(t >= 1 for t in tokens)
    rows = after["decode_rows"] - before["decode_rows"]
    steps = after["decode_steps"] - before["decode_steps"]
    assert rows / steps > 4, f"mean batch size {rows / steps:.1f}: requests were not batched"


def test_errors_have_openai_shape(client, server):
    with pytest.raises(openai.AuthenticationError) as info:
        openai.OpenAI(base_url=f"{server}/v1", api_key="wrong", max_retries=0).models.list()
    assert info.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=USER)
    assert info.value.body["code"] == "model_not_found" and "calc" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="calc", messages=USER, extra_body={"temprature": 0.5})
    assert info.value.body["message"] == "Unrecognized request argument supplied: temprature"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="calc", messages=[{"role": "user", "content": "word " * 9000}], max_tokens=10
        )
    body = info.value.body
    assert (
        body["code"] == "context_length_exceeded"
        and "maximum context length is 8192 tokens" in body["message"]
    )
    with pytest.raises(openai.BadRequestError) as info:
        bad_tool = {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object", "required": 3}},
        }
        client.chat.completions.create(model="calc", messages=USER, tools=[bad_tool])
    assert "not a valid JSON Schema" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="calc", messages=[{"role": "tool", "tool_call_id": "x", "content": "1"}]
        )
    assert "must answer a call" in info.value.body["message"]
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    malformed = httpx.post(f"{server}/v1/chat/completions", content=b"{not json", headers=auth)
    assert malformed.status_code == 400 and "not valid JSON" in malformed.json()["error"]["message"]
    big = httpx.post(f"{server}/v1/chat/completions", content=b"x" * (17 * 2**20), headers=auth)
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    missing = httpx.get(f"{server}/v1/nothing", headers=auth)
    assert missing.status_code == 404 and set(missing.json()["error"]) == {"message", "type", "param", "code"}


def test_health_needs_no_token(server):
    health = httpx.get(f"{server}/health").json()
    assert health["status"] == "ok" and health["model"] == "calc"
    assert json.loads(json.dumps(health))["policy_version"] == 0
