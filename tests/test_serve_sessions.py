"""Token capture through the policy server (in this process, the official ``openai`` client over
loopback): a session equals, token for token, the same episode run by the agent loop; drift is
counted; sessions belong to one task; rewards close them; weight swaps never mix versions; a full
server answers 429; a client that leaves mid-generation frees its rows."""

from __future__ import annotations

import asyncio
import copy
import typing

import httpx
import openai
import pytest
import torch
from conftest import ScriptedEngine

from horizonrl.agent.config import AgentConfig
from horizonrl.agent.loop import Agent
from horizonrl.engine.base import Completion, SamplingParams
from horizonrl.engine.hf import HFEngine
from horizonrl.envs.calc import CalcEnv, CalcOptions
from horizonrl.serve.app import create_app
from horizonrl.serve.server import LiveServer
from horizonrl.serve.service import PolicyService, ServeLimits
from horizonrl.serve.weights import WeightSwaps
from horizonrl.types import Message


def _wire(messages: list[Message]) -> list[dict]:
    """Messages as an OpenAI client sends them."""
    out = []
    for m in messages:
        item = {"role": m.role, "content": m.content}
        if m.tool_calls:
            item["tool_calls"] = [c.model_dump() for c in m.tool_calls]
        if m.tool_call_id:
            item["tool_call_id"] = m.tool_call_id
        out.append(item)
    return out


@pytest.fixture
def tiny_engine(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    return HFEngine(copy.deepcopy(model), tokenizer, max_batch_size=16, seed=0)


def _task():
    return CalcEnv.make_tasks("test", 1, 3, CalcOptions(min_ops=2, max_ops=2))[0]


async def test_a_session_equals_the_agent_loops_episode_token_for_token(tiny_engine, tokenizer):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=5)
    agent = Agent(
        tokenizer, tiny_engine, sampling, AgentConfig(max_turns=4, max_malformed=4), tiny_engine.max_context
    )
    task = _task()
    expected = await agent.run(CalcEnv(CalcOptions(min_ops=2, max_ops=2)), task, "ep-1", "g")
    assert expected.num_turns >= 2 and expected.messages[-1].role == "assistant"

    service = PolicyService(tiny_engine, tokenizer, "calc")
    env = CalcEnv(CalcOptions(min_ops=2, max_ops=2))
    initial = await env.reset(task)
    service.sessions.open(
        "ep-1", task_id=task.id, env=env, initial=initial, forced=sampling, token_budget=agent.token_budget
    )
    async with LiveServer(create_app(service)) as url:
        client = openai.AsyncOpenAI(
            base_url=f"{url}/v1", api_key="none", max_retries=0, default_headers={"X-Session-Id": "ep-1"}
        )
        tools = [t.to_openai() for t in env.tools]
        for k, message in enumerate(expected.messages):
            if message.role == "assistant":
                reply = await client.chat.completions.create(
                    model="calc", messages=_wire(expected.messages[:k]), tools=tools
                )
                assert reply.model_extra["horizon"]["session_id"] == "ep-1"
    got = service.sessions.take("ep-1").trajectory("finished", 0.0)
    assert got.prompt_ids == expected.prompt_ids
    assert got.response_ids == expected.response_ids
    assert got.loss_mask == expected.loss_mask
    assert got.logprobs == pytest.approx(expected.logprobs, abs=1e-4)
    assert got.metrics["drift_resets"] == 0


class ServeScriptedEngine(ScriptedEngine):
    """The scripted test double with what the server reads of an engine (context, EOS ids, vocabulary
    size, weights version, streaming callback). It stands in for a model that writes tool calls,
    which a tiny random model cannot be steered to; the server, HTTP and client are real."""

    max_context = 8192
    weights_version = 0
    stats: typing.ClassVar[dict] = {}

    def __init__(self, tokenizer, texts):
        super().__init__(tokenizer, texts)
        self.eos_token_ids = frozenset({tokenizer.eos_token_id})
        self.vocab_size = len(tokenizer)

    async def generate(self, prompt_ids, params, on_token=None) -> Completion:
        completion = await super().generate(prompt_ids, params)
        for tok, lp in zip(completion.token_ids, completion.logprobs, strict=True):
            if on_token is not None:
                on_token(tok, lp)
        return completion


def _oracle_texts(task) -> list[str]:
    oracle = CalcEnv.oracle(CalcOptions())
    return [
        oracle.act(task, [Message(role="assistant")] * turn) for turn in range(len(task.data["steps"]) + 1)
    ]


async def test_tool_calls_through_the_step_endpoint_give_the_agent_loops_sequence(tokenizer):
    task, opts = _task(), CalcOptions(min_ops=2, max_ops=2, step_credit=0.5)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=64)
    texts = _oracle_texts(task)
    loop_engine = ServeScriptedEngine(tokenizer, texts)
    agent = Agent(tokenizer, loop_engine, sampling, AgentConfig(max_turns=6), 8192)
    expected = await agent.run(CalcEnv(opts), task, "ep-2", "g")
    assert expected.finish == "finished" and expected.success

    service = PolicyService(ServeScriptedEngine(tokenizer, texts), tokenizer, "calc")
    env = CalcEnv(opts)
    initial = await env.reset(task)
    service.sessions.open("ep-2", task_id=task.id, env=env, initial=initial, forced=sampling)
    async with LiveServer(create_app(service, token="t")) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="t", max_retries=0)
        messages = _wire(initial)
        tools = [t.to_openai() for t in env.tools]
        async with httpx.AsyncClient(headers={"Authorization": "Bearer t"}) as http:
            for _ in range(6):
                reply = await client.chat.completions.create(
                    model="calc", messages=messages, tools=tools, extra_headers={"X-Session-Id": "ep-2"}
                )
                choice = reply.choices[0]
                assert choice.finish_reason == "tool_calls" and "<tool_call>" not in (
                    choice.message.content or ""
                )
                messages.append(choice.message.model_dump(exclude_none=True))
                step = (await http.post(f"{url}/v1/horizon/sessions/ep-2/step", json={})).json()
                messages += step["messages"]
                if step["done"]:
                    break
            assert step["done"] and step["reward"] > 0
            after = await http.post(f"{url}/v1/horizon/sessions/ep-2/step", json={})
            assert after.status_code == 400 and "episode is over" in after.json()["error"]["message"]
            record = (await http.get(f"{url}/v1/horizon/sessions/ep-2")).json()
    assert record["response_ids"] == expected.response_ids and record["prompt_ids"] == expected.prompt_ids
    assert record["loss_mask"] == expected.loss_mask
    session = service.sessions.get("ep-2")
    assert session.turn_rewards == expected.turn_rewards
    assert env.metrics["success"] == 1.0


async def test_drift_is_counted_when_a_client_rewrites_its_history(tiny_engine, tokenizer):
    service = PolicyService(tiny_engine, tokenizer, "calc")
    async with LiveServer(create_app(service)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        first = [{"role": "user", "content": "Hello there"}]
        r1 = await client.chat.completions.create(model="calc", messages=first, max_tokens=5, user="s-drift")
        follow = [
            *first,
            {"role": "assistant", "content": r1.choices[0].message.content},
            {"role": "user", "content": "And then?"},
        ]
        await client.chat.completions.create(model="calc", messages=follow, max_tokens=5, user="s-drift")
        session = service.sessions.get("s-drift")
        assert session.drift_resets == 0 and session.num_turns == 2
        kept_tokens = sum(session.loss_mask)
        rewritten = [
            *first,
            {"role": "assistant", "content": "I said something else."},
            {"role": "user", "content": "And then?"},
        ]
        await client.chat.completions.create(model="calc", messages=rewritten, max_tokens=5, user="s-drift")
    traj = service.sessions.get("s-drift").trajectory("finished", 0.0)
    assert traj.metrics["drift_resets"] == 1.0
    assert traj.metrics["dropped_model_tokens"] == kept_tokens
    assert sum(traj.loss_mask) <= 5  # only the last sequence's model tokens remain to train on


async def test_sessions_belong_to_one_task_and_a_reward_closes_them(tiny_engine, tokenizer):
    service = PolicyService(tiny_engine, tokenizer, "calc")
    task = _task()
    initial = await CalcEnv(CalcOptions()).reset(task)
    service.sessions.open("bound", task_id=task.id, initial=initial, forced=SamplingParams(max_new_tokens=4))
    async with LiveServer(create_app(service)) as url:
        client = openai.AsyncOpenAI(
            base_url=f"{url}/v1", api_key="x", max_retries=0, default_headers={"X-Session-Id": "bound"}
        )
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(
                model="calc", messages=[{"role": "user", "content": "other task"}]
            )
        assert info.value.body["code"] == "session_task_mismatch"
        with pytest.raises(openai.BadRequestError, match="n must be 1"):
            await client.chat.completions.create(model="calc", messages=_wire(initial), n=2)
        ok = await client.chat.completions.create(model="calc", messages=_wire(initial), max_tokens=50)
        assert ok.usage.completion_tokens <= 4  # the session's forced max_new_tokens wins
        async with httpx.AsyncClient() as http:
            posted = await http.post(f"{url}/v1/horizon/sessions/bound/reward", json={"reward": 0.75})
            assert posted.json()["closed"] is True
            again = await http.post(f"{url}/v1/horizon/sessions/bound/reward", json={"reward": 1.0})
            assert again.status_code == 409
            bad = await http.post(f"{url}/v1/horizon/sessions/bound/reward", json={"reward": "NaN"})
            assert bad.status_code == 400
            nobody = await http.post(f"{url}/v1/horizon/sessions/nobody/reward", json={"reward": 1})
            assert nobody.status_code == 404
        with pytest.raises(openai.APIStatusError) as info:
            await client.chat.completions.create(model="calc", messages=_wire(initial))
        assert info.value.status_code == 409 and "closed" in info.value.body["message"]
    assert service.sessions.get("bound").reward == 0.75


async def test_a_weight_swap_waits_for_requests_in_flight_and_never_mixes_versions(tiny_engine, tokenizer):
    service = PolicyService(tiny_engine, tokenizer, "calc")
    new_weights = copy.deepcopy(tiny_engine.model)
    with torch.no_grad():
        for p in new_weights.parameters():
            p.add_(0.05 * torch.randn_like(p))
    async with LiveServer(create_app(service)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)

        async def ask(i: int):
            r = await client.chat.completions.create(
                model="calc",
                messages=[{"role": "user", "content": f"q{i}"}],
                max_tokens=48,
                temperature=0,
                seed=1,
            )
            return r.model_extra["horizon"]["policy_version"]

        early = [asyncio.create_task(ask(i)) for i in range(6)]
        while service.in_flight < 6:
            await asyncio.sleep(0.01)
        swap = asyncio.create_task(service.swap_weights(lambda: tiny_engine.update_weights(new_weights)))
        await asyncio.sleep(0.05)
        late = [asyncio.create_task(ask(i)) for i in range(6)]
        record = await swap
        versions_early = await asyncio.gather(*early)
        versions_late = await asyncio.gather(*late)
    assert versions_early == [0] * 6
    assert versions_late == [1] * 6
    assert record.version == 1 and record.paused_s >= record.update_s > 0


async def test_a_full_server_answers_429(tiny_engine, tokenizer):
    service = PolicyService(tiny_engine, tokenizer, "calc", ServeLimits(max_in_flight=2))
    async with LiveServer(create_app(service)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        results = await asyncio.gather(
            *(
                client.chat.completions.create(
                    model="calc", messages=[{"role": "user", "content": "hi"}], max_tokens=32
                )
                for _ in range(6)
            ),
            return_exceptions=True,
        )
    limited = [r for r in results if isinstance(r, openai.RateLimitError)]
    assert limited and limited[0].body["code"] == "rate_limit_exceeded"
    assert any(not isinstance(r, Exception) for r in results)
    assert service.in_flight == 0


async def test_a_client_that_leaves_mid_generation_frees_its_rows(tiny_engine, tokenizer):
    service = PolicyService(tiny_engine, tokenizer, "calc")
    async with LiveServer(create_app(service)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        stream = await client.chat.completions.create(
            model="calc",
            messages=[{"role": "user", "content": "tell me a story"}],
            max_tokens=4000,
            stream=True,
            temperature=1.0,
        )
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 3:
                break
        await stream.close()
        for _ in range(1000):  # at once on an idle machine; allow a loaded one 10 s
            if service.in_flight == 0:
                break
            await asyncio.sleep(0.01)
        assert service.in_flight == 0
        # the engine drops the row at its next decode step (on a loaded machine a token may still
        # come between the handler's exit and that step): wait for the count to settle, then it stays
        generated = -1
        for _ in range(50):
            now = tiny_engine.stats["generated_tokens"]
            if now == generated:
                break
            generated = now
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.3)
        assert tiny_engine.stats["generated_tokens"] == generated  # the row was dropped, not finished
        assert generated < 4000
        async with httpx.AsyncClient(timeout=0.3) as http:  # a plain request abandoned by its client
            with pytest.raises(httpx.ReadTimeout):
                await http.post(
                    f"{url}/v1/chat/completions",
                    json={
                        "model": "calc",
                        "messages": [{"role": "user", "content": "x"}],
                        "max_tokens": 4000,
                    },
                )
        for _ in range(1000):
            if service.in_flight == 0:
                break
            await asyncio.sleep(0.01)
        assert service.in_flight == 0
        reply = await client.chat.completions.create(
            model="calc", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert reply.usage.completion_tokens >= 1


async def test_weights_endpoint_swaps_in_a_saved_policy_and_refuses_a_bad_one(
    tiny_engine, tokenizer, tmp_path
):
    from horizonrl.config import load_config
    from horizonrl.models import load_base
    from horizonrl.policy import write_policy
    from horizonrl.serve.server import policy_loader
    from horizonrl.train.runtime import checkpoint_loader
    from horizonrl.trainable import wrap_lora

    config = load_config("configs/calc.yaml", ["model.path=tiny-random", "model.dtype=float32"])
    loaded = load_base(config.model)
    policy = wrap_lora(loaded.base, config.model.lora)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    write_policy(tmp_path / "policy", model=policy, tokenizer=loaded.tokenizer, base=loaded.identity)
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "config.json").write_text("{}")
    service = PolicyService(tiny_engine, tokenizer, "calc")
    before = {k: v.clone() for k, v in tiny_engine.model.state_dict().items()}
    swaps = WeightSwaps(policy_loader(checkpoint_loader(config.model), tiny_engine), roots=[tmp_path])
    app = create_app(service, token="t", weight_swaps=swaps)
    auth = {"Authorization": "Bearer t"}
    async with LiveServer(app) as url, httpx.AsyncClient(timeout=60, headers=auth) as http:
        bad = await http.post(f"{url}/v1/horizon/weights", json={"checkpoint": str(tmp_path / "foreign")})
        message = bad.json()["error"]["message"]
        assert bad.status_code == 400 and "foreign" in message and "config.json" not in message
        assert service.policy_version == 0
        assert all(torch.equal(v, tiny_engine.model.state_dict()[k]) for k, v in before.items())
        good = await http.post(f"{url}/v1/horizon/weights", json={"checkpoint": str(tmp_path / "policy")})
        assert good.status_code == 200 and good.json()["policy_version"] == 1
    changed = [k for k, v in before.items() if not torch.equal(v, tiny_engine.model.state_dict()[k])]
    assert changed and all("proj" in k for k in changed)  # the LoRA-adapted weights, merged in


class _WholeCompletions:
    """An engine that answers whole completions (as one in another process does): no per-token
    callback."""

    def __init__(self, engine):
        self.inner = engine
        for name in ("max_context", "eos_token_ids", "vocab_size", "weights_version", "stats"):
            setattr(self, name, getattr(engine, name))

    async def generate(self, prompt_ids, params):
        return await self.inner.generate(prompt_ids, params)


async def test_streaming_from_an_engine_without_token_callbacks_sends_the_text_at_the_end(
    tiny_engine, tokenizer
):
    service = PolicyService(_WholeCompletions(tiny_engine), tokenizer, "calc")
    async with LiveServer(create_app(service)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        kwargs = {
            "model": "calc",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 10,
            "temperature": 0,
        }
        plain = await client.chat.completions.create(**kwargs)
        stream = await client.chat.completions.create(**kwargs, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == plain.choices[0].message.content


async def test_streamed_turns_of_a_session_are_recorded_and_the_session_stays_usable(tiny_engine, tokenizer):
    """A streamed reply continues a session as a plain one does: its tokens join the session's record
    and the next request of the session (streamed again, then plain) is answered."""
    service = PolicyService(tiny_engine, tokenizer, "calc")
    async with LiveServer(create_app(service)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "Hello there"}]
        for turn in range(2):
            stream = await client.chat.completions.create(
                model="calc", messages=messages, max_tokens=5, user="s-stream", stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            messages = [
                *messages,
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"{turn}?"},
            ]
        plain = await client.chat.completions.create(
            model="calc", messages=messages, max_tokens=5, user="s-stream"
        )
        assert plain.choices[0].finish_reason in ("stop", "length")
    session = service.sessions.get("s-stream")
    assert session.num_turns == 3 and session.drift_resets == 0
    assert not session.lock.locked()


async def test_concurrent_streamed_sessions_are_recorded_apart_and_none_stays_locked(tiny_engine, tokenizer):
    """Four named sessions stream their turns at the same time (and a fifth is left mid-stream by its
    client): each records exactly its own turns, without drift, and every session's lock is free
    afterwards, so the abandoned session answers its next request."""
    service = PolicyService(tiny_engine, tokenizer, "calc")
    async with LiveServer(create_app(service)) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)

        async def converse(name: str) -> None:
            messages = [{"role": "user", "content": f"Hello from {name}"}]
            for turn in range(2):
                stream = await client.chat.completions.create(
                    model="calc", messages=messages, max_tokens=5, user=name, stream=True, seed=turn
                )
                text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
                messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"{turn}?"}]

        async def leave(name: str) -> None:  # reads the first event, then drops the connection
            body = {"model": "calc", "messages": [{"role": "user", "content": "go on"}], "max_tokens": 4000}
            async with (
                httpx.AsyncClient(timeout=60) as http,
                http.stream(
                    "POST", f"{url}/v1/chat/completions", json={**body, "user": name, "stream": True}
                ) as res,
            ):
                async for _ in res.aiter_lines():
                    break

        await asyncio.gather(*(converse(f"c-{i}") for i in range(4)), leave("left"))
        # the abandoned stream stops generating and lets go of its session (at once on an idle machine)
        for _ in range(1000):
            if service.in_flight == 0 and not service.sessions.get("left").lock.locked():
                break
            await asyncio.sleep(0.01)
        assert service.in_flight == 0 and not service.sessions.get("left").lock.locked()
        assert tiny_engine.stats["generated_tokens"] < 1000  # its rows were dropped, not run to 4000
        again = await asyncio.wait_for(
            client.chat.completions.create(
                model="calc", messages=[{"role": "user", "content": "again"}], max_tokens=3, user="left"
            ),
            timeout=60,
        )
        assert again.choices[0].finish_reason in ("stop", "length")
    for i in range(4):
        session = service.sessions.get(f"c-{i}")
        assert session.num_turns == 2 and session.drift_resets == 0 and not session.lock.locked()
        assert tokenizer.decode(session.prompt_ids).count(f"Hello from c-{i}") == 1
    assert not service.sessions.get("left").lock.locked()


async def test_streams_dropped_by_their_client_stop_generating_whoever_notices_first(tiny_engine, tokenizer):
    """A client that reads the first event of a stream and drops the connection: the server may
    notice through its own watcher or through the response being cancelled; either way the
    generation stops (the rows are dropped, not run to max_tokens) and the session is let go."""
    service = PolicyService(tiny_engine, tokenizer, "calc")
    body = {
        "model": "calc",
        "messages": [{"role": "user", "content": "go on"}],
        "max_tokens": 4000,
        "stream": True,
    }
    async with LiveServer(create_app(service)) as url, httpx.AsyncClient(base_url=url, timeout=60) as http:
        for trial in range(10):
            before = tiny_engine.stats["generated_tokens"]
            async with http.stream("POST", "/v1/chat/completions", json={**body, "user": f"s{trial}"}) as res:
                async for _ in res.aiter_lines():
                    break
            for _ in range(500):  # at once on an idle machine; allow a loaded one 5 s
                if service.in_flight == 0:
                    break
                await asyncio.sleep(0.01)
            assert service.in_flight == 0 and not service.sessions.get(f"s{trial}").lock.locked()
            assert tiny_engine.stats["generated_tokens"] - before < 1000, "the dropped stream ran on"
