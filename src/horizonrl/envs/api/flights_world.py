"""The flights world: a small, stateful airline API with rules a newcomer discovers by trying.

Pure Python and deterministic: the same seed gives the same schedule, passengers, balance and
existing orders. The rules are not in the tool descriptions; the world's error messages reveal them:

- booking needs an ``offer_id`` that a ``search_flights`` call in this session returned;
- a ticket for a child (under 12) needs the child's passenger id, and an adult of the account booked
  on the same flight first;
- an order can be cancelled only before its flight departs (refund: 90% of the price);
- the account balance pays for tickets; a booking it cannot cover fails.

:meth:`FlightsWorld.state` is what checkers read (:mod:`horizonrl.envs.api.checker`);
:data:`STATE_SCHEMA` declares its fields.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

CITIES = ("Berlin", "Paris", "Rome", "Madrid", "London", "Vienna", "Lisbon", "Prague")
TODAY = "2026-12-04"
DATES = tuple(f"2026-12-{day:02d}" for day in range(1, 15))
CABINS = ("economy", "business")
CHILD_AGE = 12
REFUND_SHARE = 0.9

#: The fields of :meth:`FlightsWorld.state` that a checker may name.
STATE_SCHEMA: dict[str, Any] = {
    "balance": "number",
    "today": "string",
    "orders": {
        "order_id": "string",
        "flight_id": "string",
        "passenger_id": "string",
        "passenger_name": "string",
        "origin": "string",
        "destination": "string",
        "date": "string",
        "cabin": "string",
        "status": "string",
        "price": "number",
    },
    "passengers": {"passenger_id": "string", "name": "string", "age": "number"},
}


class WorldError(Exception):
    """An operation the world refuses; its message is the observation the agent reads."""


@dataclass
class Flight:
    flight_id: str
    origin: str
    destination: str
    date: str
    departs: str
    price: float  # economy; business costs 2.5x
    seats: dict[str, int]


@dataclass
class FlightsWorld:
    """One account's view of the airline (see the module doc for its rules)."""

    seed: int = 0
    balance: float = 2000.0
    flights: dict[str, Flight] = field(default_factory=dict)
    passengers: dict[str, dict[str, Any]] = field(default_factory=dict)
    orders: dict[str, dict[str, Any]] = field(default_factory=dict)
    offers: dict[str, dict[str, Any]] = field(default_factory=dict)
    _next_order: int = 1003
    _next_offer: int = 1
    _next_passenger: int = 4

    @classmethod
    def create(cls, seed: int = 0) -> FlightsWorld:
        world = cls(seed=seed)
        rng = random.Random(f"flights-{seed}")
        number = 100
        for i, origin in enumerate(CITIES):
            for destination in CITIES[i + 1 :] + CITIES[:i]:
                if rng.random() > 0.45:  # not every pair of cities is connected
                    continue
                for date in DATES:
                    for _ in range(rng.choice((1, 1, 2))):
                        number += 1
                        hour = rng.choice((6, 8, 11, 14, 17, 20))
                        world.flights[f"HR{number}"] = Flight(
                            flight_id=f"HR{number}",
                            origin=origin,
                            destination=destination,
                            date=date,
                            departs=f"{hour:02d}:{rng.choice(('05', '20', '35', '50'))}",
                            price=float(rng.randrange(60, 320, 5)),
                            seats={"economy": rng.randrange(0, 9), "business": rng.randrange(0, 4)},
                        )
        world.passengers = {
            "P1": {"passenger_id": "P1", "name": "Alex Morgan", "age": 38},
            "P2": {"passenger_id": "P2", "name": "Sam Morgan", "age": 36},
            "P3": {"passenger_id": "P3", "name": "Mia Morgan", "age": 8},
        }
        past = world._first_flight(lambda f: f.date < TODAY)
        future = world._first_flight(lambda f: f.date > TODAY and f.origin != past.origin)
        for order_id, flight, pid in (("O-1001", past, "P1"), ("O-1002", future, "P2")):
            world.orders[order_id] = world._order(order_id, flight, pid, "economy", flight.price)
        return world

    def _first_flight(self, accept: Any) -> Flight:
        return next(f for f in sorted(self.flights.values(), key=lambda f: f.flight_id) if accept(f))

    def _order(self, order_id: str, flight: Flight, pid: str, cabin: str, price: float) -> dict[str, Any]:
        return {
            "order_id": order_id,
            "flight_id": flight.flight_id,
            "passenger_id": pid,
            "passenger_name": self.passengers[pid]["name"],
            "origin": flight.origin,
            "destination": flight.destination,
            "date": flight.date,
            "cabin": cabin,
            "status": "booked",
            "price": price,
        }

    # ------------------------------------------------------------------ what checkers read
    def state(self) -> dict[str, Any]:
        return {
            "balance": round(self.balance, 2),
            "today": TODAY,
            "orders": [dict(o) for o in self.orders.values()],
            "passengers": [dict(p) for p in self.passengers.values()],
        }

    # ------------------------------------------------------------------ operations
    def search_flights(self, origin: str, destination: str, date: str) -> list[dict[str, Any]]:
        origin, destination = _city(origin), _city(destination)
        if date not in DATES:
            raise WorldError(f"no schedule for {date!r}: flights are listed from {DATES[0]} to {DATES[-1]}")
        found = [
            f
            for f in self.flights.values()
            if f.origin == origin and f.destination == destination and f.date == date
        ]
        offers = []
        for flight in sorted(found, key=lambda f: f.departs):
            for cabin in CABINS:
                offer_id = f"OF{self._next_offer}"
                self._next_offer += 1
                price = flight.price * (2.5 if cabin == "business" else 1.0)
                self.offers[offer_id] = {"flight_id": flight.flight_id, "cabin": cabin, "price": price}
                offers.append(
                    {
                        "offer_id": offer_id,
                        "flight_id": flight.flight_id,
                        "departs": f"{flight.date} {flight.departs}",
                        "cabin": cabin,
                        "price": price,
                        "seats_left": flight.seats[cabin],
                    }
                )
        return offers

    def book_ticket(self, offer_id: str, passenger_id: str = "") -> dict[str, Any]:
        offer = self.offers.get(offer_id.strip())
        if offer is None:
            raise WorldError(f"unknown offer {offer_id!r}: book an offer_id returned by search_flights")
        flight = self.flights[offer["flight_id"]]
        pid = passenger_id.strip() or "P1"
        passenger = self.passengers.get(pid)
        if passenger is None:
            raise WorldError(f"unknown passenger {pid!r}: passenger ids come from list_passengers")
        if flight.date < TODAY:
            raise WorldError(f"flight {flight.flight_id} departed on {flight.date}")
        if flight.seats[offer["cabin"]] <= 0:
            raise WorldError(f"no {offer['cabin']} seats left on {flight.flight_id}")
        if any(
            o["flight_id"] == flight.flight_id and o["passenger_id"] == pid and o["status"] == "booked"
            for o in self.orders.values()
        ):
            raise WorldError(f"{passenger['name']} already holds a ticket on {flight.flight_id}")
        if passenger["age"] < CHILD_AGE and not any(
            o["flight_id"] == flight.flight_id
            and o["status"] == "booked"
            and self.passengers[o["passenger_id"]]["age"] >= CHILD_AGE
            for o in self.orders.values()
        ):
            raise WorldError(
                f"{passenger['name']} is a child: book an adult of this account on {flight.flight_id} first"
            )
        price = offer["price"] * (0.5 if passenger["age"] < CHILD_AGE else 1.0)
        if price > self.balance:
            raise WorldError(f"the balance ({self.balance:.2f}) does not cover {price:.2f}")
        order_id = f"O-{self._next_order}"
        self._next_order += 1
        self.orders[order_id] = self._order(order_id, flight, pid, offer["cabin"], price)
        self.balance -= price
        flight.seats[offer["cabin"]] -= 1
        return dict(self.orders[order_id])

    def cancel_order(self, order_id: str) -> dict[str, Any]:
        order = self.orders.get(order_id.strip())
        if order is None:
            raise WorldError(f"unknown order {order_id!r}: see list_orders")
        if order["status"] != "booked":
            raise WorldError(f"order {order['order_id']} is already {order['status']}")
        if order["date"] < TODAY:
            raise WorldError(
                f"order {order['order_id']}: the flight departed on {order['date']}; it cannot be cancelled"
            )
        refund = round(order["price"] * REFUND_SHARE, 2)
        order["status"] = "cancelled"
        self.balance += refund
        self.flights[order["flight_id"]].seats[order["cabin"]] += 1
        return {**order, "refund": refund}

    def get_order(self, order_id: str) -> dict[str, Any]:
        order = self.orders.get(order_id.strip())
        if order is None:
            raise WorldError(f"unknown order {order_id!r}: see list_orders")
        return dict(order)

    def list_orders(self) -> list[dict[str, Any]]:
        return [dict(o) for o in self.orders.values()]

    def list_passengers(self) -> list[dict[str, Any]]:
        return [dict(p) for p in self.passengers.values()]

    def add_passenger(self, name: str, age: int) -> dict[str, Any]:
        name = " ".join(name.split())
        if not name:
            raise WorldError("a passenger needs a name")
        if not 0 <= age <= 120:
            raise WorldError(f"age {age} is not between 0 and 120")
        if any(p["name"].lower() == name.lower() for p in self.passengers.values()):
            raise WorldError(f"{name!r} is already a passenger of this account")
        pid = f"P{self._next_passenger}"
        self._next_passenger += 1
        self.passengers[pid] = {"passenger_id": pid, "name": name, "age": age}
        return dict(self.passengers[pid])

    def get_balance(self) -> float:
        return round(self.balance, 2)


def _city(name: str) -> str:
    for city in CITIES:
        if city.lower() == name.strip().lower():
            return city
    raise WorldError(f"unknown city {name!r}: the airline flies between {', '.join(CITIES)}")
