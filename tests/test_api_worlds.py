"""The flights API world, the checker language and validation by replay."""

from __future__ import annotations

import asyncio
import json

import pytest

from horizonrl.envs.api.checker import CheckerError, holds, parse_checker
from horizonrl.envs.api.flights import FlightsEnv, flights_profile, heldout_tasks, source_quote
from horizonrl.envs.api.flights_world import STATE_SCHEMA, TODAY, FlightsWorld, WorldError
from horizonrl.envs.registry import get_env_class
from horizonrl.evolve.validate import REASONS, replay
from horizonrl.types import Task


def _task(calls, checker, query="do it", **data):
    return Task(
        id="t",
        env="flights",
        split="test",
        data={"query": query, "checker": checker, "reference_solution": calls, **data},
    )


def _booked(**fields):
    return {
        "exists": "orders",
        "where": {
            "all": [{"field": k, "op": "eq", "value": v} for k, v in {**fields, "status": "booked"}.items()]
        },
    }


# ---------------------------------------------------------------------------------------------------
# the world and its hidden rules


def test_the_world_is_deterministic_per_seed_and_differs_across_seeds():
    assert FlightsWorld.create(0).state() == FlightsWorld.create(0).state()
    assert FlightsWorld.create(0).orders != FlightsWorld.create(3).orders or (
        FlightsWorld.create(0).flights.keys() != FlightsWorld.create(3).flights.keys()
    )


def test_booking_needs_an_offer_from_a_search_and_pays_from_the_balance():
    world = FlightsWorld.create(0)
    with pytest.raises(WorldError, match="book an offer_id returned by search_flights"):
        world.book_ticket("HR101")
    flight = next(f for f in world.flights.values() if f.date > TODAY and f.seats["economy"] > 0)
    offers = world.search_flights(flight.origin, flight.destination, flight.date)
    offer = next(o for o in offers if o["flight_id"] == flight.flight_id and o["cabin"] == "economy")
    before = world.balance
    order = world.book_ticket(offer["offer_id"])
    assert order["passenger_id"] == "P1" and order["status"] == "booked"
    assert world.balance == pytest.approx(before - offer["price"])


def test_a_child_needs_an_adult_on_the_same_flight_first():
    world = FlightsWorld.create(0)
    flight = next(f for f in world.flights.values() if f.date > TODAY and f.seats["economy"] >= 2)
    offer = next(
        o
        for o in world.search_flights(flight.origin, flight.destination, flight.date)
        if o["flight_id"] == flight.flight_id and o["cabin"] == "economy"
    )
    with pytest.raises(WorldError, match="is a child: book an adult of this account"):
        world.book_ticket(offer["offer_id"], "P3")
    world.book_ticket(offer["offer_id"])
    child = world.book_ticket(offer["offer_id"], "P3")
    assert child["price"] == pytest.approx(offer["price"] / 2)


def test_a_departed_flight_cannot_be_cancelled_and_a_future_one_refunds_ninety_percent():
    world = FlightsWorld.create(0)
    with pytest.raises(WorldError, match=r"departed .* cannot be cancelled"):
        world.cancel_order("O-1001")
    before, price = world.balance, world.orders["O-1002"]["price"]
    assert world.cancel_order("O-1002")["refund"] == pytest.approx(0.9 * price)
    assert world.balance == pytest.approx(before + 0.9 * price)
    with pytest.raises(WorldError, match="already cancelled"):
        world.cancel_order("O-1002")


def test_a_world_error_is_an_observation_and_the_episode_goes_on():
    from horizonrl.types import Action, ToolCall

    async def run():
        env = FlightsEnv()
        await env.reset(_task([], _booked(passenger_id="P1")))
        result = await env.step(
            Action(text="", tool_calls=[ToolCall(id="1", name="book_ticket", arguments={"offer_id": "OF9"})])
        )
        return env, result

    env, result = asyncio.run(run())
    assert result.observations[0].content.startswith("Error: unknown offer 'OF9'") and not result.done
    assert env.metrics["world_errors"] == 1


def test_the_profile_names_every_tool_of_the_env():
    env = FlightsEnv()
    tools = {spec.name for spec in env.tools} - {"finish"}
    operations = {op for entity in flights_profile()["entities"] for op in entity["operations"]}
    assert operations == tools
    assert set(flights_profile()) >= {"name", "background", "entities", "task_preferences"}


# ---------------------------------------------------------------------------------------------------
# the checker language


def test_checkers_compare_fields_and_quantify_over_collections():
    state = FlightsWorld.create(0).state()
    assert holds(parse_checker({"field": "balance", "op": "eq", "value": 2000}, STATE_SCHEMA), state)
    assert holds(parse_checker(_booked(order_id="o-1002"), STATE_SCHEMA), state)  # case-insensitive
    count = {
        "count": "passengers",
        "where": {"field": "age", "op": "lt", "value": 12},
        "op": "eq",
        "value": 1,
    }
    assert holds(parse_checker(count, STATE_SCHEMA), state)
    both = {"all": [{"not": _booked(passenger_id="P3")}, {"any": [_booked(passenger_id="P2")]}]}
    assert holds(parse_checker(both, STATE_SCHEMA), state)
    assert not holds(parse_checker({"field": "balance", "op": "gt", "value": 2000}, STATE_SCHEMA), state)


@pytest.mark.parametrize(
    "checker, message",
    [
        ({"field": "wallet", "op": "eq", "value": 1}, "unknown state field 'wallet'"),
        (
            {"exists": "orders", "where": {"field": "seat", "op": "eq", "value": 1}},
            "unknown state field 'seat'",
        ),
        ({"field": "balance", "op": "matches", "value": 1}, "unknown operator 'matches'"),
        ({"field": "orders", "op": "eq", "value": 1}, "'orders' is a collection"),
        ({"field": "balance", "op": "gt", "value": "1"}, "'gt' needs a number"),
        ({"all": []}, "expected a non-empty list"),
        ({"field": "balance", "value": 1, "op": "eq", "code": "x"}, "unexpected keys ['code']"),
        ("balance > 1", "expected an object, got str"),
        # no attribute access, no call: a checker is data, so these are just unknown fields
        ({"field": "__class__", "op": "eq", "value": 1}, "unknown state field '__class__'"),
        ({"field": "__import__('os').system('touch /tmp/x')", "op": "eq", "value": 0}, "unknown state field"),
    ],
)
def test_a_bad_checker_is_refused_naming_what_is_wrong(checker, message):
    with pytest.raises(CheckerError) as info:
        parse_checker(checker, STATE_SCHEMA)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_checker_value_that_looks_like_code_is_only_compared(tmp_path):
    marker = tmp_path / "ran"
    code = f"__import__('os').system('touch {marker}')"
    check = parse_checker({"field": "today", "op": "eq", "value": code}, STATE_SCHEMA)
    assert not holds(check, FlightsWorld.create(0).state())
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------------
# validation by replay


def _verdict(task):
    return asyncio.run(replay(FlightsEnv, task))


def test_replay_accepts_a_correct_reference_and_rejects_a_wrong_one():
    world = FlightsWorld.create(0)
    flight = next(f for f in world.flights.values() if f.date > TODAY and f.seats["economy"] > 0)
    offer = next(
        o
        for o in world.search_flights(flight.origin, flight.destination, flight.date)
        if o["flight_id"] == flight.flight_id and o["cabin"] == "economy"
    )
    search = {
        "name": "search_flights",
        "arguments": {"origin": flight.origin, "destination": flight.destination, "date": flight.date},
    }
    book = {"name": "book_ticket", "arguments": {"offer_id": offer["offer_id"]}}
    checker = _booked(passenger_id="P1", flight_id=flight.flight_id)
    assert _verdict(_task([search, book], checker)).valid
    # booked for the wrong passenger: the calls run, the checker does not hold
    wrong = {"name": "book_ticket", "arguments": {"offer_id": offer["offer_id"], "passenger_id": "P2"}}
    verdict = _verdict(_task([search, wrong], checker))
    assert (verdict.valid, verdict.reason) == (False, "checker_fails")
    # a booking without the search: the world refuses the call
    verdict = _verdict(_task([book], checker))
    assert (verdict.valid, verdict.reason) == (False, "call_failed") and "search_flights" in verdict.detail


@pytest.mark.parametrize(
    "calls, checker, reason",
    [
        ([{"name": "list_orders"}], _booked(order_id="O-1002"), "trivial"),
        ([{"name": "teleport", "arguments": {}}], _booked(passenger_id="P3"), "unknown_tool"),
        ([{"name": "list_orders"}], {"field": "wallet", "op": "eq", "value": 0}, "bad_checker"),
        ("list_orders()", _booked(passenger_id="P3"), "malformed"),
        ([{"name": "list_orders", "arguments": "all"}], _booked(passenger_id="P3"), "malformed"),
    ],
)
def test_replay_drops_a_bad_task_with_its_reason_and_never_raises(calls, checker, reason):
    verdict = _verdict(_task(calls, checker))
    assert (verdict.valid, verdict.reason) == (False, reason) and reason in REASONS


def test_every_held_out_task_replays_valid_and_is_not_trivial():
    tasks = heldout_tasks()
    assert len(tasks) == 50 and len({t.id for t in tasks}) == 50
    verdicts = [_verdict(t) for t in tasks]
    assert [v.reason for v in verdicts if not v.valid] == []
    kinds = {t.data["kind"] for t in tasks}
    assert {"book_self", "book_other", "child", "cancel", "add_and_book", "cheapest", "round_trip"} <= kinds


def test_flights_ships_no_training_tasks_and_says_where_they_come_from():
    from horizonrl.errors import ConfigError

    cls = get_env_class("flights")
    with pytest.raises(ConfigError, match="ships no training tasks: synthesize them"):
        cls.make_tasks("train", 4, 0, cls.Options())
    assert [t.id for t in cls.make_tasks("test", 3, 0, cls.Options())] == [t.id for t in heldout_tasks()[:3]]


def test_the_oracle_solves_every_held_out_task_through_the_agent_loop(flights_oracle_eval):
    """``horizon eval configs/flights.yaml --policy oracle``: the reference solutions written as
    tool calls by the scripted oracle, parsed by the agent loop, scored by the checkers."""
    figures = flights_oracle_eval()
    assert figures["success_rate"] == 1.0 and figures["num_trajectories"] == 50


def test_a_quote_is_the_printed_record_an_argument_came_from_never_one_the_request_spells():
    offers = json.dumps(
        [
            {"cabin": "economy", "flight_id": "HR1", "offer_id": "OF1"},
            {"cabin": "business", "flight_id": "HR1", "offer_id": "OF2"},
        ],
        sort_keys=True,
    )
    quote = source_quote({"offer_id": "OF2"}, "Fly me in business.", ["not json", offers])
    assert quote == '{"cabin": "business", "flight_id": "HR1", "offer_id": "OF2"'
    assert quote in offers  # a verbatim prefix of what the policy read: the rest follows by copying
    # a city the request names is not copied from a result, and nothing else matches
    assert source_quote({"origin": "Berlin"}, "from Berlin", ['[{"origin": "Berlin"}]']) is None
    assert source_quote({"offer_id": "OF9"}, "", [offers]) is None


def test_the_quoting_oracle_quotes_the_chosen_offer_before_booking_and_still_solves_every_task(
    tmp_path, flights_oracle_eval
):
    """With ``quote_sources`` the oracle's booking turn first quotes the search record of the offer
    it books (cabin first), then the call; the held-out tasks are still all solved."""
    assert flights_oracle_eval("name=quotes", "env.options.quote_sources=true")["success_rate"] == 1.0
    records = [json.loads(line) for line in (tmp_path / "quotes" / "eval.jsonl").read_text().splitlines()]
    business = next(r for r in records if "business" in r["messages"][1]["content"])
    booking = next(m["content"] for m in business["messages"] if "book_ticket" in m["content"])
    assert booking.startswith('{"cabin": "business"') and booking.index('"OF') < booking.index("<tool_call>")


def test_an_unknown_policy_for_eval_is_one_line_naming_the_valid_ones(tmp_path):
    from typer.testing import CliRunner

    from horizonrl.cli import app

    result = CliRunner().invoke(
        app, ["eval", "configs/flights.yaml", "--policy", "expert", f"output_dir={tmp_path}"]
    )
    assert result.exit_code == 2
    assert "--policy 'expert': expected 'model' or 'oracle'" in result.output
