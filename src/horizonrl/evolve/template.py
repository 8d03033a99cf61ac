"""Scripted synthesis: a user's request written from a task's checker by templates.

A synthesizer for when no model at hand writes usable requests. It knows nothing about a
particular world: the checker (what must hold at the end) is put into words — the collection's
item named by its fields (``an order with origin Berlin, destination Paris, date December 5``), a
changed item by its key and its new values (``order O-1002: status cancelled``) — with an opening
and field order drawn by the seed, and ISO dates written either as they are or as a month and day,
so the requests vary in the ways users vary. When a task has one goal made by one call (a focused
candidate), the request asks for that call's action in its own words — ``book_ticket`` makes ``Book
a ticket with origin Berlin, …``, ``cancel_order`` makes ``Cancel order O-1002`` — as a user
asks for an action, not for a state. The reference solution and the checker stay the world's; only
the words come from here.
"""

from __future__ import annotations

import datetime as dt
import random
import re
from typing import Any

_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")

NEW_ITEM_OPENINGS = (
    "I need {item}.",
    "Please set up {item}.",
    "Can you get me {item}?",
    "Arrange {item}, please.",
    "Make sure there is {item}.",
)
CHANGED_ITEM_OPENINGS = (
    "Please update {item}.",
    "Change {item}.",
    "I want {item}.",
    "Can you make it {item}?",
)


ACTION_OPENINGS = (
    "{Verb} {item}.",
    "Please {verb} {item}.",
    "Can you {verb} {item}?",
    "I need you to {verb} {item}.",
    "{Verb} {item}, please.",
)


_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")


def say_field(name: str) -> str:
    """A state field's name in words: a dotted name without its owner (``TradingBot.account_info.balance``
    → ``account info balance``), underscores and camelCase as spaces (``fuelLevel`` → ``fuel level``)."""
    _, dot, rest = name.partition(".")
    words = (rest if dot else name).replace(".", " ").replace("_", " ")
    return _CAMEL.sub(" ", words).lower() if _CAMEL.search(words) else words


def singular(collection: str) -> str:
    """``orders`` → ``order``, ``passengers`` → ``passenger``, ``entries`` → ``entry``."""
    if collection.endswith("ies"):
        return collection[:-3] + "y"
    if collection.endswith("s") and not collection.endswith("ss"):
        return collection[:-1]
    return collection


def says_nothing(value: Any) -> bool:
    """An empty value (``""``, ``[]``, ``{}``), which a request leaves out."""
    return value in ("", [], {})


def say_value(value: Any, rng: random.Random) -> str:
    if isinstance(value, str) and _ISO_DATE.match(value) and rng.random() < 0.6:
        day = dt.date.fromisoformat(value)
        return f"{day:%B} {day.day}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _fields(conditions: list[dict[str, Any]], rng: random.Random, skip: set[str]) -> str:
    parts = [
        f"{say_field(c['field'])} {say_value(c['value'], rng)}"
        for c in conditions
        if c["field"] not in skip and not says_nothing(c["value"])
    ]
    rng.shuffle(parts)
    if len(parts) > 1:
        return ", ".join(parts[:-1]) + " and " + parts[-1]
    return parts[0] if parts else ""


def _item(part: dict[str, Any], rng: random.Random, keys: dict[str, str]) -> tuple[str, Any, str]:
    """An ``exists`` part in words: (its collection's noun, the key's value when the part names a
    changed item or None for a new one, the other fields)."""
    collection = part["exists"]
    conditions = part.get("where", {}).get("all", [])
    key = keys.get(collection)
    keyed = next((c for c in conditions if c["field"] == key), None) if key else None
    noun = singular(say_field(collection))
    if keyed is not None:
        return noun, keyed["value"], _fields(conditions, rng, {key})
    return noun, None, _fields(conditions, rng, set())


def _with_article(noun: str) -> str:
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


VERBS = frozenset(
    {
        "activate",
        "add",
        "adjust",
        "approve",
        "archive",
        "assign",
        "authenticate",
        "block",
        "book",
        "buy",
        "cancel",
        "change",
        "check",
        "clear",
        "close",
        "comment",
        "complete",
        "copy",
        "create",
        "deactivate",
        "delete",
        "deposit",
        "disable",
        "edit",
        "enable",
        "fill",
        "find",
        "follow",
        "fund",
        "get",
        "list",
        "lock",
        "log",
        "login",
        "logout",
        "make",
        "mark",
        "move",
        "notify",
        "open",
        "order",
        "pay",
        "place",
        "post",
        "press",
        "purchase",
        "put",
        "read",
        "register",
        "release",
        "remove",
        "rename",
        "reply",
        "request",
        "reserve",
        "reset",
        "resolve",
        "retweet",
        "return",
        "schedule",
        "search",
        "sell",
        "send",
        "set",
        "share",
        "sort",
        "start",
        "stop",
        "submit",
        "switch",
        "transfer",
        "turn",
        "unblock",
        "unfollow",
        "unlock",
        "update",
        "upload",
        "view",
        "withdraw",
        "write",
    }
)  # an operation name starting with one of these reads as an action


def action_words(action: str) -> tuple[str, str]:
    """An operation's name as a verb and its object: ``book_ticket`` → (``book``, ``ticket``),
    ``fillFuelTank`` → (``fill``, ``fuel tank``), ``logout`` → (``logout``, ``""``). A name of
    several words that does not start with an English verb is used whole: ``ticket_login`` →
    (``use``, ``ticket login``); a one-word name is its own verb (``mkdir``)."""
    parts = _CAMEL.sub(" ", action.replace("_", " ")).lower().split()
    if not parts:
        return action, ""
    if parts[0] not in VERBS and len(parts) > 1:
        return "use", " ".join(parts)
    return parts[0], " ".join(parts[1:])


def _settings(parts: list[dict[str, Any]], rng: random.Random) -> str:
    """Field parts as ``the fuel level is 19 and the ac mode is heat`` (empty values left out)."""
    said = [
        f"the {say_field(p['field'])} is {say_value(p['value'], rng)}"
        for p in parts
        if not says_nothing(p["value"])
    ]
    rng.shuffle(said)
    return ", ".join(said[:-1]) + " and " + said[-1] if len(said) > 1 else "".join(said)


def action_query(
    action: str, parts: list[dict[str, Any]], rng: random.Random, keys: dict[str, str]
) -> str | None:
    """A request for ``action`` (an operation name such as ``book_ticket``) that made what ``parts``
    check: one item of a collection, or fields only (``Fill the fuel tank so that the fuel level is
    19``); None for anything else."""
    verb, obj = action_words(action)
    if all("field" in p for p in parts):
        settings = _settings(parts, rng)
        if not settings:
            return None
        item = (f"the {obj} " if obj else "") + f"so that {settings}"
    elif len(parts) == 1 and "exists" in parts[0]:
        noun, key_value, fields = _item(parts[0], rng, keys)
        if key_value is not None:
            item = f"{obj or noun} {key_value}" + (f" ({fields})" if fields else "")
        else:
            item = f"{_with_article(obj or noun)} with {fields}"
    else:
        return None
    return rng.choice(ACTION_OPENINGS).format(Verb=verb.capitalize(), verb=verb, item=item)


def template_query(
    checker: dict[str, Any],
    rng: random.Random,
    keys: dict[str, str] | None = None,
    action: str | None = None,
) -> str:
    """A request that asks for what ``checker`` checks. ``keys`` maps a collection to its key field:
    a part that names the key (a changed item) is written as a change of that item. ``action``: the
    operation that made the change (a focused task); the request asks for it when the checker holds
    one item or fields only (:func:`action_query`)."""
    keys = keys or {}
    parts = checker.get("all", [])
    if action and parts:
        query = action_query(action, parts, rng, keys)
        if query is not None:
            return query
    sentences = []
    for part in parts:
        if "exists" in part:
            noun, key_value, fields = _item(part, rng, keys)
            if key_value is not None and fields:
                item = f"{noun} {key_value} with {fields}"
                sentences.append(rng.choice(CHANGED_ITEM_OPENINGS).format(item=item))
            else:  # a new item, or one that only has to exist (``a contact Alice``)
                named = f"{_with_article(noun)}" + (f" {key_value}" if key_value is not None else "")
                item = f"{named} with {fields}" if fields else named
                sentences.append(rng.choice(NEW_ITEM_OPENINGS).format(item=item))
        elif "field" in part:
            field = say_field(part["field"])
            sentences.append(f"The {field} should be {say_value(part['value'], rng)}.")
    return " ".join(sentences)
