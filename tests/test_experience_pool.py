"""The experience pool: the extractor's structured replies (always the structure from a real engine
role, bounded to fit the token budget), other replies read tolerantly, both validated;
near-duplicates dropped with a real sentence embedding, retrieval by "when to use", eviction of the
least-used, a checkpoint round trip (a corrupt file named), and the <EXP> block inserted and
stripped."""

from __future__ import annotations

import json
import re

import pytest

from horizonrl.engine.hf import HFEngine
from horizonrl.errors import DataError
from horizonrl.evolve.config import ExperienceConfig
from horizonrl.evolve.embed import QueryEmbedder
from horizonrl.evolve.experience import (
    Experience,
    ExperiencePool,
    has_experiences,
    lesson_bounds,
    lessons_model,
    parse_experiences,
    read_experiences,
    read_seed_experiences,
    strip_experiences,
    with_experiences,
)
from horizonrl.roles import Roles, RolesConfig
from horizonrl.roles.structured import output_schema, parse_reply
from horizonrl.train.experience import ExperienceStage
from horizonrl.types import Message, Trajectory

TOOLS = {"search_flights", "book_ticket", "list_passengers"}


@pytest.fixture(scope="module")
def embedder():
    return QueryEmbedder()


def test_extractor_replies_are_read_in_json_or_labelled_form_and_validated():
    reply = json.dumps(
        [
            {"when_to_use": "booking a flight", "content": "call search_flights first, then book_ticket"},
            {"when_to_use": "a child travels", "content": "call find_guardian(child) before booking"},
            {"when_to_use": "", "content": "anything"},
        ]
    )
    kept, dropped = parse_experiences(reply, TOOLS, source="t1")
    assert [e.when_to_use for e in kept] == ["booking a flight"] and kept[0].source == "t1"
    assert dropped == {"unknown_tool": 1, "incomplete": 1}
    labelled = "WHEN TO USE: the user names a passenger\nCONTENT: look the id up with list_passengers()\n"
    kept, dropped = parse_experiences(labelled, TOOLS)
    assert [(e.when_to_use, e.content) for e in kept] == [
        ("the user names a passenger", "look the id up with list_passengers()")
    ]
    assert parse_experiences("I have no advice.", TOOLS) == ([], {"unparsed": 1})


def test_a_structured_reply_is_validated_like_text_and_an_unusable_one_is_read_as_text():
    model = lessons_model(256)
    lessons = [
        {"when_to_use": "booking a flight", "content": "call search_flights first"},
        {"when_to_use": "a child travels", "content": "call find_guardian(child)"},
    ]
    reply = parse_reply(json.dumps({"lessons": lessons}), model)
    kept, dropped = read_experiences(reply, TOOLS, source="t1")
    assert [e.when_to_use for e in kept] == ["booking a flight"] and dropped == {"unknown_tool": 1}
    # cut off by max_tokens: not the structure; the complete lessons in its text still count
    cut = parse_reply(json.dumps({"lessons": lessons})[:-30], model)
    assert not cut.ok and [e.when_to_use for e in read_experiences(cut, TOOLS)[0]] == ["booking a flight"]
    assert read_experiences(parse_reply("no advice", model), TOOLS) == ([], {"unparsed": 1})


def test_the_reply_is_bounded_to_fit_its_token_budget():
    assert lesson_bounds(256) == (2, 72, 144) and lesson_bounds(64)[0] == 1
    assert lesson_bounds(4096) == (3, 200, 400)
    schema = output_schema(lessons_model(256))
    lesson = next(iter(schema["$defs"].values()))["properties"]
    assert schema["properties"]["lessons"]["maxItems"] == 2 and lesson["content"]["maxLength"] == 144
    too_many = [{"when_to_use": "w", "content": "c"}] * 3
    assert not parse_reply(json.dumps({"lessons": too_many}), lessons_model(256)).ok


def _attempt(task: str, success: bool) -> Trajectory:
    return Trajectory(
        id=f"{task}-{success}",
        task_id=task,
        group_id=task,
        env="flights",
        messages=[
            Message(role="user", content=f"Book the cheapest flight, {task}."),
            Message(role="assistant", content="search_flights(origin='ROM')"),
            Message(role="tool", content="offer 7: 120 EUR"),
            Message(role="assistant", content="book_ticket(offer=7)" if success else "book_ticket(offer=9)"),
        ],
        prompt_ids=[1],
        reward=float(success),
        finish="finished",
    )


async def test_a_real_engine_extractor_always_replies_in_structure(tiny_model_and_tokenizer, embedder):
    model, tokenizer = tiny_model_and_tokenizer
    engine = HFEngine(model, tokenizer)
    roles = Roles(RolesConfig(), engine, tokenizer)
    cfg = ExperienceConfig(enabled=True, extract_per_step=3, max_tokens=128)
    stage = ExperienceStage(cfg, roles.get("extractor"), tokenizer, sorted(TOOLS), embedder)
    trajectories = [_attempt(task, ok) for task in ("to Rome", "to Oslo", "to Bern") for ok in (True, False)]
    counts = await stage.extract(trajectories, step=1)
    assert counts["experience/extraction_groups"] == 3 and counts["experience/unstructured"] == 0
    assert not any(k.startswith("experience/dropped_unparsed") for k in counts)
    usage = roles.usage()["extractor"]
    assert usage["structured"] == 3 and usage["unusable"] == 0
    assert 1 <= len(stage.pool) <= 3  # one lesson a reply at 128 tokens, near-duplicates dropped
    await engine.close()


def test_the_pool_drops_near_duplicates_retrieves_by_situation_and_evicts_the_least_used(embedder):
    pool = ExperiencePool(embedder, max_size=3)
    counts = pool.add(
        [
            Experience(when_to_use="booking a flight ticket", content="search first"),
            Experience(when_to_use="booking a plane ticket", content="search before booking"),  # cos 0.92
            Experience(when_to_use="cancelling an order", content="list the orders to find its id"),
            Experience(when_to_use="adding a new passenger", content="give the name and the age"),
        ],
        step=1,
    )
    assert counts == {"added": 3, "duplicate": 1}
    top = pool.retrieve("I want to cancel my trip to Rome", k=1)
    assert [e.when_to_use for e in top] == ["cancelling an order"]
    pool.retrieve("book me a ticket to Paris", k=1)
    counts = pool.add([Experience(when_to_use="checking the account balance", content="get_balance")], step=2)
    assert counts == {"added": 1, "evicted": 1}
    assert "adding a new passenger" not in [e.when_to_use for e in pool.items]  # never retrieved


def test_the_pool_round_trips_through_a_checkpoint_file_and_a_corrupt_one_is_named(embedder, tmp_path):
    pool = ExperiencePool(embedder)
    pool.add([Experience(when_to_use="booking a flight", content="search first")])
    pool.retrieve("a flight to Rome", k=1)
    path = tmp_path / "experience_pool.json"
    pool.save(path)
    restored = ExperiencePool(embedder)
    restored.load(path)
    assert restored.items == pool.items and bool((restored.vectors == pool.vectors).all())
    path.write_text("{not json")
    with pytest.raises(DataError, match=r"experience_pool\.json.*corrupt"):
        ExperiencePool(embedder).load(path)


def test_the_exp_block_is_inserted_in_the_system_prompt_and_stripped_exactly():
    messages = [Message(role="system", content="You book flights."), Message(role="user", content="Rome?")]
    guided = with_experiences(messages, [Experience(when_to_use="booking", content="search first")])
    assert has_experiences(guided) and guided[0].content.startswith("You book flights.\n\n<EXP>")
    assert guided[1] == messages[1]
    assert strip_experiences(guided) == messages
    assert with_experiences(messages, []) == messages


def removed_span(before: list[int], after: list[int]) -> tuple[int, int] | None:
    """``(start, end)`` when ``after`` is ``before`` with the one contiguous span ``before[start:end]``
    removed, else None."""
    if len(after) > len(before):
        return None
    start = 0
    while start < len(after) and before[start] == after[start]:
        start += 1
    cut = len(before) - len(after)
    return (start, start + cut) if before[start + cut :] == after[start:] else None


def test_stripping_a_trajectory_removes_exactly_the_exp_tokens_and_keeps_the_response(tokenizer):
    from horizonrl.chat import ChatFormat
    from horizonrl.evolve.experience import strip_trajectory
    from horizonrl.types import Trajectory

    chat = ChatFormat(tokenizer, [], None)
    plain = [
        Message(role="system", content="You book flights."),
        Message(role="user", content="Rome, Dec 5."),
    ]
    guided = with_experiences(
        plain, [Experience(when_to_use="booking", content="search, then book the offer")]
    )
    prompt = chat.prompt_ids(guided)
    response = [*chat.encode("search_flights(...)"), chat.end_of_turn]
    traj = Trajectory(
        id="t",
        task_id="q",
        group_id="g",
        env="flights",
        messages=[*guided, Message(role="assistant", content="search_flights(...)")],
        prompt_ids=prompt,
        response_ids=response,
        loss_mask=[1] * len(response),
        logprobs=[-0.5] * len(response),
        finish="finished",
    )
    stripped = strip_trajectory(traj, tokenizer)
    assert stripped.response_ids == traj.response_ids and stripped.loss_mask == traj.loss_mask
    assert stripped.logprobs == traj.logprobs
    assert stripped.prompt_ids == chat.prompt_ids(plain)
    span = removed_span(traj.prompt_ids, stripped.prompt_ids)
    assert span is not None, "the block is not one contiguous run of prompt tokens"
    removed = tokenizer.decode(traj.prompt_ids[span[0] : span[1]])
    assert removed.strip().startswith("<EXP>") and removed.strip().endswith("</EXP>")
    assert not has_experiences(stripped.messages)
    assert strip_trajectory(stripped, tokenizer) is stripped  # nothing left to strip
    # a block whose tokens are not in the prompt: the sample is left out, never trained on wrongly
    assert strip_trajectory(traj.model_copy(update={"prompt_ids": [1, 2, 3]}), tokenizer) is None


def test_experience_mixed_jobs_give_the_block_to_round_eta_n_samples_of_each_group():
    from horizonrl.rollout.job import experience_samples, make_jobs, with_notes
    from horizonrl.types import Task

    tasks = [Task(id=f"t{i}", env="calc", data={}) for i in range(3)]
    jobs = with_notes(make_jobs(tasks, 4), {"t0": "\n\n<EXP>a</EXP>", "t1": "\n\n<EXP>b</EXP>"}, eta=0.5)
    notes = [(j.group_id, j.system_note) for j in jobs]
    assert notes[:4] == [("t0", "\n\n<EXP>a</EXP>")] * 2 + [("t0", "")] * 2
    assert notes[4:8] == [("t1", "\n\n<EXP>b</EXP>")] * 2 + [("t1", "")] * 2
    assert all(note == "" for _, note in notes[8:])  # no experience retrieved for t2
    assert [experience_samples(8, eta) for eta in (0.0, 0.25, 0.5, 1.0)] == [0, 2, 4, 8]
    with pytest.raises(ValueError, match="eta"):
        experience_samples(4, 1.5)


def test_a_jobs_note_reaches_the_episodes_system_prompt_and_its_tokens(tokenizer):
    import asyncio

    from horizonrl.agent.config import AgentConfig
    from horizonrl.agent.job import RolloutJob
    from horizonrl.agent.loop import Agent, Episode
    from horizonrl.engine.base import SamplingParams
    from horizonrl.envs.calc import CalcEnv
    from horizonrl.evolve.experience import experience_block

    task = CalcEnv.make_tasks("test", 1, 0, CalcEnv.Options())[0]
    agent = Agent(tokenizer, None, SamplingParams(), AgentConfig())
    note = experience_block([Experience(when_to_use="two steps", content="compute the inner step first")])
    plain, guided = Episode(RolloutJob(task, "a", "g")), Episode(RolloutJob(task, "b", "g", system_note=note))
    asyncio.run(agent.start(plain, CalcEnv))
    asyncio.run(agent.start(guided, CalcEnv))
    assert guided.messages[0].content == plain.messages[0].content + note
    assert "<EXP>" in tokenizer.decode(guided.prompt_ids) and "<EXP>" not in tokenizer.decode(
        plain.prompt_ids
    )
    assert strip_experiences(guided.messages) == plain.messages


def test_a_seed_file_is_read_line_by_line_and_a_bad_line_is_named(tmp_path):
    seed = tmp_path / "seed.jsonl"
    seed.write_text(
        json.dumps({"when_to_use": "booking a flight", "content": "call search_flights first"})
        + "\n\n"
        + json.dumps({"when_to_use": "a child travels", "content": "book an adult first"})
        + "\n",
        encoding="utf-8",
    )
    kept = read_seed_experiences(seed, TOOLS)
    assert [(e.when_to_use, e.source) for e in kept] == [
        ("booking a flight", "seed:1"),
        ("a child travels", "seed:3"),
    ]
    cases = {
        "not json\n": "line 1: expected a JSON object",
        json.dumps({"when": "x", "content": "y"}) + "\n": "line 1: expected a JSON object",
        json.dumps({"when_to_use": "a child", "content": "call find_guardian(child)"})
        + "\n": "calls find_guardian, which the env does not have; its tools: book_ticket, list_passengers",
        json.dumps({"when_to_use": "", "content": "y"}) + "\n": "must each be non-empty text",
        "\n": "holds no experience",
    }
    for text, message in cases.items():
        seed.write_text(text, encoding="utf-8")
        with pytest.raises(DataError, match=re.escape(message)):
            read_seed_experiences(seed, TOOLS)
