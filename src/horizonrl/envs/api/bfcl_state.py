"""BFCL's API objects as a state that checkers read: plain fields and collections of records.

The BFCL classes keep their state in Python objects (a directory tree, dicts of tweets and orders,
lists of tickets). Self-questioning needs it in the form of :mod:`.checker`: top-level fields and
collections whose items are flat records. :func:`state_view` converts every public attribute of
every instance under the name ``Class.attribute``:

- a scalar, or a list or set of scalars, is a field (``VehicleControlAPI.engine_state``,
  ``TradingBot.watch_list``); a dict of scalars is one field per key
  (``VehicleControlAPI.doorStatus.driver``);
- a dict or list of records is a collection (``TwitterAPI.tweets``, ``TicketAPI.ticket_queue``):
  an item per record, ``key`` first (the dict key, else the record's ``id``, else its position),
  then the record's scalar and list fields; a dict of lists has an item per element
  (``TwitterAPI.retweets``: ``key`` the user, ``value`` a tweet id); a one-entry record is a pair
  (``MessageAPI.inbox``: ``{"USR002": "hi"}`` → ``key`` USR002, ``value`` hi), and so is an entry
  of a dict of scalars that grows (``MessageAPI.user_map``: ``key`` Alice, ``value`` USR001);
- the file system's tree is ``GorillaFileSystem.files`` (``path``, ``name``, ``content``),
  ``GorillaFileSystem.directories`` (``path``, ``name``) and the ``current_directory`` field.

Collections whose records BFCL's code writes (:data:`RECORDS`) stay collections when empty, so a
checker about a first ticket parses in a world with none. An item's schema is open (any field
name): records of one collection differ in their fields. :func:`assigned_fields` names what the
world assigns itself (ids, counters, tokens, timestamps, a new card's balance), which a checker
derived from a change leaves out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: collections that hold records even while empty: ``Class.attribute``
RECORDS = frozenset(
    {
        "TwitterAPI.tweets",
        "TwitterAPI.comments",
        "TwitterAPI.retweets",
        "MessageAPI.inbox",
        "MessageAPI.user_map",
        "TicketAPI.ticket_queue",
        "TradingBot.orders",
        "TradingBot.stocks",
        "TradingBot.transaction_history",
        "TravelAPI.credit_card_list",
        "TravelAPI.booking_record",
        "GorillaFileSystem.files",
        "GorillaFileSystem.directories",
    }
)
#: attributes that are flags of how a scenario was loaded, not state
SKIPPED = frozenset({"long_context"})
#: item fields the world assigns (left out of a checker on a new item): ids, timestamps, a new card's
#: balance — except where the key is what the user names (a message's receiver, a commented tweet) or
#: the value is the id the world gives (a new contact's user id)
ASSIGNED_ITEM_FIELDS = ("key", "id", "timestamp", "transaction_id", "balance")
ASSIGNED_BY_COLLECTION: dict[str, tuple[str, ...]] = {
    "MessageAPI.inbox": (),
    "MessageAPI.user_map": ("value",),
    "TwitterAPI.comments": ("timestamp",),
}
_ASSIGNED_SUFFIXES = ("_counter", "_count", "generated_ids", "access_token", "token_expires_in")


class OpenRecord(dict):
    """An item schema that lists the fields seen and accepts any field name (typed ``string``):
    records of one collection carry different fields, and it may be empty when a checker is parsed."""

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str)

    def __missing__(self, key: str) -> str:
        return "string"


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _plain(value: Any) -> Any:
    """A field value as checkers compare it: scalars as they are, sets and tuples as lists."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    if isinstance(value, (list, tuple)):
        return [v if _scalar(v) else str(v) for v in value]
    return value if _scalar(value) else str(value)


def _record(key: Any, value: Any) -> dict[str, Any]:
    """One collection item: ``key`` first, then the record's fields (a pair for anything else)."""
    item: dict[str, Any] = {"key": key}
    if isinstance(value, Mapping):
        for field, v in value.items():
            if str(field) != "key" and (_scalar(v) or isinstance(v, (list, tuple, set))):
                item[str(field)] = _plain(v)
    else:
        item["value"] = _plain(value)
    return item


def _items(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, Mapping):
        items = []
        for key, v in value.items():
            if isinstance(v, (list, tuple)):
                items.extend(_record(key, e) for e in v)
            else:  # a record, or a pair (a contact's name and user id)
                items.append(_record(key, v))
        return items
    items = []
    for position, v in enumerate(value):
        if isinstance(v, Mapping) and len(v) == 1:
            ((k, inner),) = v.items()
            items.append(_record(k, inner))
        elif isinstance(v, Mapping):
            items.append(_record(v.get("id", position), v))
        else:
            items.append(_record(position, v))
    return items


def _is_collection(name: str, value: Any) -> bool:
    if name in RECORDS:
        return True
    if isinstance(value, Mapping):
        return any(isinstance(v, (Mapping, list, tuple)) for v in value.values())
    return isinstance(value, (list, tuple)) and any(isinstance(v, Mapping) for v in value)


MAX_DEPTH = 32  # BFCL's ``mv``/``cp`` can put a directory inside itself: the walk stops there


def _tree(root: Any, files: list[dict[str, Any]], dirs: list[dict[str, Any]]) -> None:
    """Every file and directory under ``root`` by path, each directory object visited once."""
    seen = {id(root)}
    name = root.name.strip("/")
    stack = [(root, f"/{name}" if name else "", 0)]
    while stack:
        directory, path, depth = stack.pop()
        for name, entry in sorted(directory.contents.items()):
            entry_path = f"{path}/{name}"
            if hasattr(entry, "contents"):
                dirs.append({"key": entry_path, "path": entry_path, "name": name})
                if id(entry) not in seen and depth < MAX_DEPTH:
                    seen.add(id(entry))
                    stack.append((entry, entry_path, depth + 1))
            else:
                content = getattr(entry, "content", "")
                files.append({"key": entry_path, "path": entry_path, "name": name, "content": content})
    files.sort(key=lambda f: f["path"])
    dirs.sort(key=lambda d: d["path"])


def _directory_path(directory: Any) -> str:
    names: list[str] = []
    while directory is not None and len(names) <= MAX_DEPTH:
        names.append(directory.name.strip("/"))
        directory = directory.parent
    return "/" + "/".join(n for n in reversed(names) if n)


def _put(state: dict[str, Any], name: str, value: Any) -> None:
    if hasattr(value, "contents") and hasattr(value, "parent"):  # the file system's root directory
        files: list[dict[str, Any]] = []
        dirs: list[dict[str, Any]] = []
        _tree(value, files, dirs)
        owner = name.split(".")[0]
        state[f"{owner}.files"] = files
        state[f"{owner}.directories"] = dirs
    elif _is_collection(name, value):
        state[name] = _items(value)
    elif isinstance(value, Mapping):
        for key, v in value.items():
            state[f"{name}.{key}"] = _plain(v)
    else:
        state[name] = _plain(value)


def state_view(instances: Mapping[str, Any]) -> dict[str, Any]:
    """The state of ``instances`` (class name → live BFCL instance) as checkers read it."""
    state: dict[str, Any] = {}
    for class_name, instance in instances.items():
        for attribute, value in vars(instance).items():
            if attribute.startswith("_") or attribute in SKIPPED:
                continue
            _put(state, f"{class_name}.{attribute}", value)
        current = getattr(instance, "_current_dir", None)
        if current is not None and hasattr(current, "contents"):
            state[f"{class_name}.current_directory"] = _directory_path(current)
    return state


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, list):
        return "list"
    return "string"


def state_schema(state: Mapping[str, Any]) -> dict[str, Any]:
    """The schema of a :func:`state_view`: a type per field; per collection an open item schema
    listing ``key`` and then every field its items have now (a checker may name any other)."""
    schema: dict[str, Any] = {}
    for name, value in state.items():
        collection = name in RECORDS or (
            isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)
        )
        if collection:
            fields = OpenRecord(key="string")
            for item in value:
                for field, v in item.items():
                    fields.setdefault(field, _kind(v))
            schema[name] = fields
        else:
            schema[name] = _kind(value)
    return schema


def assigned_fields(schema: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """What the world assigns itself: per collection its ids, timestamps and a new card's balance;
    at the top level (``""``) the counters and login tokens."""
    assigned: dict[str, tuple[str, ...]] = {
        name: ASSIGNED_BY_COLLECTION.get(name, ASSIGNED_ITEM_FIELDS)
        for name, kind in schema.items()
        if isinstance(kind, dict)
    }
    fields = [name for name, kind in schema.items() if not isinstance(kind, dict)]
    assigned[""] = tuple(name for name in fields if name.endswith(_ASSIGNED_SUFFIXES))
    return assigned
