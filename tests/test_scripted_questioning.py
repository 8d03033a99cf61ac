"""Self-questioning without a capable model: the scripted random-walk explorer grounds its
arguments in what the world said, the template writer puts a checker into words, a task's reference
keeps only the calls it needs, and a recipe trains on synthesized tasks while it evaluates on the
env's own held-out set."""

from __future__ import annotations

import asyncio
import json
import random
import re

from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.config import load_config
from horizonrl.envs.api.flights import FlightsEnv, heldout_tasks
from horizonrl.envs.factory import eval_tasks, make_tasks
from horizonrl.evolve.candidates import minimal_reference
from horizonrl.evolve.config import ExploreConfig
from horizonrl.evolve.profile import env_profile
from horizonrl.evolve.synthesize import synthesize
from horizonrl.evolve.template import singular, template_query
from horizonrl.evolve.validate import replay
from horizonrl.evolve.walk import ValuePool, walk, walk_arguments
from horizonrl.types import ToolSpec

runner = CliRunner()
WALK = ExploreConfig(
    explorer="walk",
    synthesizer="template",
    breadth_probes=1,
    breadth_steps=3,
    depth_sessions=60,
    depth_steps=10,
    jaccard_duplicate=1.0,
    embedding_duplicate=None,
)


def operation(name: str, **properties: dict) -> ToolSpec:
    """A tool whose parameters (JSON schemas) are all required."""
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return ToolSpec(name=name, parameters=parameters)


def test_the_value_pool_fills_parameters_from_the_worlds_answers():
    pool = ValuePool()
    pool.add_text('[{"offer_id": "OF1", "price": 90.0}]')
    pool.add_text('[{"offer_id": "OF2", "price": 90.0}, {"offer_id": "OF3", "price": 120.0}]')
    pool.add_text("Error: unknown city 'X': the airline flies between Berlin, Paris, Rome, Madrid")
    pool.add_text("Today is 2026-12-04; the schedule runs from 2026-12-01 to 2026-12-14.")
    assert pool.by_key["offer_id"] == ["OF1", "OF2", "OF3"]
    assert pool.latest["offer_id"] == ["OF2", "OF3"]
    assert pool.loose == ["Berlin", "Paris", "Rome", "Madrid"]
    rng = random.Random(0)
    spec = operation("book", offer_id={"type": "string"}, date={"type": "string"})
    drawn = [walk_arguments(spec, pool, rng) for _ in range(200)]
    offers = [d["offer_id"] for d in drawn]
    assert set(offers) <= {"OF1", "OF2", "OF3", "Berlin", "Paris", "Rome", "Madrid"}
    # mostly an offer of the newest answer, each of its offers alike (not only the last one listed)
    assert offers.count("OF2") > 50 and offers.count("OF3") > 50
    assert offers.count("OF1") < 40
    assert all("2026-12-01" <= d["date"] <= "2026-12-14" for d in drawn)


def test_the_walk_reads_values_from_the_tool_docs_and_never_passes_a_sentence_as_a_name():
    pool = ValuePool()
    pool.add_text('{"user_list": ["Alice", "Bob"], "status": "Logged out successfully"}')
    pool.add_text('{"current_directory_content": ["report.txt", "notes"]}')
    pool.add_text('{"result": 7546009.0, "error": "No significant price changes in the selected stocks."}')
    rng = random.Random(0)
    described = operation(
        "op",
        unit={"type": "string", "description": 'The unit. [Enum]: ["celsius", "fahrenheit"]'},
        grant={"type": "string", "description": "Here are the options: read_write, read, write"},
        side={"type": "string", "description": "Type of the order (Buy/Sell)."},
        fan={"type": "integer", "description": "The fan speed to set from 0 to 100."},
        precision={"type": "integer", "description": "Desired precision for the result."},
    )
    drawn = [walk_arguments(described, pool, rng) for _ in range(100)]
    assert {d["unit"] for d in drawn} == {"celsius", "fahrenheit"}
    assert {d["grant"] for d in drawn} == {"read_write", "read", "write"}
    assert {d["side"] for d in drawn} == {"Buy", "Sell"}
    assert all(0 <= d["fan"] <= 100 for d in drawn)
    assert all(isinstance(d["precision"], int) for d in drawn)  # a float result fits as a whole number
    # a parameter no key names takes values under the key its words share; names are never sentences
    named = operation(
        "op",
        user_name={"type": "string", "description": "User name of contact to be added."},
        file_name={"type": "string", "description": "The name of the file in the current directory."},
        dir_name={"type": "string", "description": "The name of the new directory."},
        destination={"type": "string", "description": "Where to go."},
    )
    drawn = [walk_arguments(named, pool, rng) for _ in range(100)]
    assert {d["user_name"] for d in drawn} == {"Alice", "Bob"}
    assert {d["file_name"] for d in drawn} == {"report.txt", "notes"}
    assert all(" " not in d["destination"] and not d["destination"].endswith(".") for d in drawn)
    message = operation("op", message={"type": "string", "description": "Message to be sent."})
    assert any(" " in walk_arguments(message, pool, rng)["message"] for _ in range(50))  # free text may


def test_a_parameter_for_something_new_takes_a_variant_of_a_name_seen():
    pool = ValuePool()
    pool.add_text('{"current_directory_content": ["report.txt"]}')
    new_file = operation(
        "touch", file_name={"type": "string", "description": "The new file in this directory."}
    )
    names = {walk_arguments(new_file, pool, random.Random(s))["file_name"] for s in range(40)}
    assert "report.txt" in names and any(re.fullmatch(r"report_\d\.txt", n) for n in names)


def test_the_walk_explores_every_operation_and_is_deterministic_for_a_seed():
    def make():
        return FlightsEnv()

    profile = env_profile("flights")
    first = asyncio.run(walk(make, profile, WALK, seed=3))
    again = asyncio.run(walk(make, profile, WALK, seed=3))
    other = asyncio.run(walk(make, profile, WALK, seed=4))
    dump = [t.model_dump() for t in first]
    assert dump == [t.model_dump() for t in again]
    assert dump != [t.model_dump() for t in other]
    accepted = {s.name for t in first for s in t.steps if s.ok}
    assert accepted >= {"search_flights", "book_ticket", "list_orders", "cancel_order"}
    # a booking used an offer a search earlier in the same session had returned
    assert any(
        s.name == "book_ticket"
        and s.ok
        and any(p.name == "search_flights" and s.arguments["offer_id"] in p.observation for p in t.steps[:i])
        for t in first
        for i, s in enumerate(t.steps)
    )


def test_scripted_synthesis_writes_valid_tasks_that_replay_and_name_no_tool():
    def make():
        return FlightsEnv()

    profile = env_profile("flights")
    traces = asyncio.run(walk(make, profile, WALK, seed=0))
    tasks, report = asyncio.run(synthesize(None, make, profile, traces, WALK, seed=0))
    assert report.kept == len(tasks) >= 10
    assert report.candidates >= report.kept
    for task in tasks:
        assert asyncio.run(replay(make, task)).valid
        assert not any(op in task.data["query"] for op in profile.operations())
    booked = [t for t in tasks if [c["name"] for c in t.data["reference_solution"]][-1] == "book_ticket"]
    assert booked, "no booking task"
    assert all(c["name"] not in ("get_balance",) for t in booked for c in t.data["reference_solution"])


def test_template_requests_name_what_the_checker_asks_for():
    checker = {
        "all": [
            {
                "exists": "orders",
                "where": {
                    "all": [
                        {"field": "origin", "op": "eq", "value": "Berlin"},
                        {"field": "date", "op": "eq", "value": "2026-12-05"},
                    ]
                },
            },
            {
                "exists": "orders",
                "where": {
                    "all": [
                        {"field": "order_id", "op": "eq", "value": "O-1002"},
                        {"field": "status", "op": "eq", "value": "cancelled"},
                    ]
                },
            },
        ]
    }
    texts = {template_query(checker, random.Random(s), {"orders": "order_id"}) for s in range(20)}
    assert len(texts) > 5  # openings, order and date forms vary with the seed
    for text in texts:
        assert "an order with" in text and "origin Berlin" in text
        assert "2026-12-05" in text or "December 5" in text
        assert "order O-1002 with status cancelled" in text
    assert singular("orders") == "order" and singular("entries") == "entry" and singular("class") == "class"


def test_a_one_goal_request_asks_for_the_action_that_made_it():
    booked = {"exists": "orders", "where": {"all": [{"field": "origin", "op": "eq", "value": "Berlin"}]}}
    cancelled = {
        "exists": "orders",
        "where": {
            "all": [
                {"field": "order_id", "op": "eq", "value": "O-1002"},
                {"field": "status", "op": "eq", "value": "cancelled"},
            ]
        },
    }
    keys = {"orders": "order_id"}
    for s in range(10):
        text = template_query({"all": [booked]}, random.Random(s), keys, action="book_ticket")
        assert re.search(r"\b[Bb]ook a ticket with origin Berlin\b", text), text
        text = template_query({"all": [cancelled]}, random.Random(s), keys, action="cancel_order")
        assert re.search(r"\b[Cc]ancel order O-1002 \(status cancelled\)", text), text
    # two goals: the state-based request (no single action to name)
    text = template_query({"all": [booked, cancelled]}, random.Random(0), keys, action="book_ticket")
    assert "an order with origin Berlin" in text


def test_a_request_for_an_action_that_sets_fields_names_the_action_and_the_values():
    fuel = {"all": [{"field": "VehicleControlAPI.fuelLevel", "op": "eq", "value": 19.0}]}
    for s in range(5):
        text = template_query(fuel, random.Random(s), {}, action="fillFuelTank")
        assert re.search(r"\b[Ff]ill the fuel tank so that the fuel level is 19\b", text), text
    login = {
        "all": [
            {"field": "TicketAPI.current_user", "op": "eq", "value": "Alice"},
            {"field": "TicketAPI.tags", "op": "eq", "value": []},
        ]
    }
    text = template_query(login, random.Random(0), {}, action="ticket_login")
    assert "use the ticket login so that the current user is alice" in text.lower() and "tags" not in text


def test_an_item_that_only_has_to_exist_is_asked_for_by_its_key():
    contact = {
        "exists": "MessageAPI.user_map",
        "where": {"all": [{"field": "key", "op": "eq", "value": "Alice"}]},
    }
    fuel = {"field": "VehicleControlAPI.fuelLevel", "op": "eq", "value": 19.0}
    for s in range(5):
        text = template_query({"all": [contact, fuel]}, random.Random(s), {"MessageAPI.user_map": "key"})
        assert "user map Alice" in text and " with ." not in text and "with ," not in text, text


def test_the_walk_passes_a_list_to_an_array_parameter():
    pool = ValuePool()
    pool.add_text('{"user_list": ["Alice", "Bob"]}')
    spec = operation("post", mentions={"type": "array", "items": {"type": "string"}, "description": "Users."})
    drawn = [walk_arguments(spec, pool, random.Random(s))["mentions"] for s in range(20)]
    assert all(isinstance(d, list) for d in drawn) and {m for d in drawn for m in d} <= {"Alice", "Bob"}


def test_a_reference_keeps_state_changes_and_the_look_ups_that_feed_them():
    calls = [
        {"name": "get_balance", "arguments": {}},
        {"name": "list_passengers", "arguments": {}},
        {
            "name": "search_flights",
            "arguments": {"origin": "Berlin", "destination": "Paris", "date": "2026-12-05"},
        },
        {"name": "list_orders", "arguments": {}},
        {"name": "book_ticket", "arguments": {"offer_id": "OF1", "passenger_id": "P3"}},
    ]
    observations = ["500", '[{"passenger_id": "P3"}]', '[{"offer_id": "OF1"}]', "[]", "{}"]
    changed = [False, False, False, False, True]
    kept = minimal_reference(calls, observations, changed, given={"Berlin", "Paris", "2026-12-05"})
    assert [c["name"] for c in kept] == ["list_passengers", "search_flights", "book_ticket"]
    # a value the request states needs no look-up
    kept = minimal_reference(calls, observations, changed, given={"P3", "Berlin", "Paris", "2026-12-05"})
    assert [c["name"] for c in kept] == ["search_flights", "book_ticket"]


def test_a_look_up_that_only_echoes_its_argument_is_no_source_of_it():
    order = {"name": "get_order", "arguments": {"order_id": "O-1001"}}
    calls = [
        {"name": "list_orders", "arguments": {}},
        order,
        order,
        order,
        {"name": "cancel_order", "arguments": {"order_id": "O-1001"}},
    ]
    shown = '{"order_id": "O-1001", "passenger_id": "P1"}'
    observations = ['[{"order_id": "O-1001"}]', shown, shown, shown, "{}"]
    changed = [False, False, False, False, True]
    kept = minimal_reference(calls, observations, changed, given=set())
    assert [c["name"] for c in kept] == ["list_orders", "cancel_order"]  # the listing revealed it
    # a value that only the order shows: the latest get_order, fed by the listing, once
    calls[-1] = {"name": "book_ticket", "arguments": {"offer_id": "OF1", "passenger_id": "P1"}}
    kept = minimal_reference(calls, observations, changed, given={"OF1"})
    assert [c["name"] for c in kept] == ["list_orders", "get_order", "book_ticket"]


def test_exploration_spreads_over_worlds_and_its_tasks_replay_in_the_world_they_came_from():
    def make():
        return FlightsEnv()

    profile = env_profile("flights")
    config = WALK.model_copy(update={"worlds": 3, "focused": True})
    traces = asyncio.run(walk(make, profile, config, seed=0))
    assert {t.world_seed for t in traces} == {0, 1, 2}
    assert [t.world_seed for t in traces if t.phase == "depth"][:4] == [0, 1, 2, 0]
    tasks, _ = asyncio.run(synthesize(None, make, profile, traces, config, seed=0))
    assert {t.data["world_seed"] for t in tasks} == {0, 1, 2}
    for task in tasks:
        assert asyncio.run(replay(make, task)).valid
    # the task data names its world: a booking replayed in another world misses its flight
    booked = [t for t in tasks if t.data["reference_solution"][-1]["name"] == "book_ticket"]
    moved = [
        t.model_copy(update={"data": {**t.data, "world_seed": (t.data["world_seed"] + 1) % 3}})
        for t in booked
    ]
    assert booked
    assert not all(asyncio.run(replay(make, t)).valid for t in moved)


def test_eval_tasks_env_reads_the_envs_held_out_split_beside_a_task_file(tmp_path):
    def held_out(config):
        ev = config.eval
        return eval_tasks(config.env, ev.split, ev.num_tasks, ev.seed, ev.tasks)

    synthetic = tmp_path / "synth.jsonl"
    synthetic.write_text(json.dumps({"id": "s1", "env": "flights", "split": "train", "data": {}}) + "\n")
    base = ["configs/flights.yaml"]
    run = load_config(base[0], [f"env.tasks_file={synthetic}", "eval.split=train", "eval.num_tasks=1"])
    assert [t.id for t in held_out(run)] == ["s1"]
    held = load_config(base[0], [f"env.tasks_file={synthetic}", "eval.tasks=env", "eval.num_tasks=50"])
    assert [t.id for t in held_out(held)] == [t.id for t in heldout_tasks()]
    assert [t.id for t in make_tasks(held.env, "train", 5, 0)] == ["s1"]  # training still reads the file
    result = runner.invoke(app, ["eval", *base, f"env.tasks_file={synthetic}", "eval.tasks=nowhere"])
    assert result.exit_code == 2
    assert "eval.tasks" in result.output and "'run'" in result.output and "'env'" in result.output


def test_evolve_train_needs_a_task_file_to_write_and_says_so(tmp_path):
    result = runner.invoke(app, ["evolve", "train", "configs/flights.yaml", f"output_dir={tmp_path}"])
    assert result.exit_code != 0
    assert "env.tasks_file" in result.output


def test_a_cap_per_operation_sequence_keeps_the_commonest_kind_from_crowding_out_the_rest():
    def make():
        return FlightsEnv()

    profile = env_profile("flights")
    traces = asyncio.run(walk(make, profile, WALK, seed=0))
    capped = WALK.model_copy(update={"max_per_signature": 1})
    tasks, report = asyncio.run(synthesize(None, make, profile, traces, capped, seed=0))
    signatures = [tuple(c["name"] for c in t.data["reference_solution"]) for t in tasks]
    assert len(signatures) == len(set(signatures)) > 1
    assert report.dropped["kind_full"] > 0
