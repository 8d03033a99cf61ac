"""Environment profiles (AgentEvolver's shape): what a world is about, its entities with their
attributes and operations, and the kinds of task to ask for.

A world may ship a hand-written profile (a ``profile()`` classmethod on its env, e.g. ``flights``);
for any other tool env :func:`profile_from_tools` derives one from the tool specs: one entity per
noun the tool names share (``search_flights``, ``book_ticket`` → ``flights``, ``ticket``), its
attributes from the tools' parameters, its operations the tools themselves.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from horizonrl.types import ToolSpec

#: verbs that open a tool name; what follows is the entity it acts on
VERBS = (
    "get", "list", "search", "find", "add", "create", "book", "cancel", "delete", "remove", "update",
    "set", "send", "post", "read", "write", "check", "buy", "sell", "open", "close", "make", "edit",
)  # fmt: skip
#: tools that end a session rather than act on the world
CONTROL_TOOLS = ("finish",)


class Entity(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    attributes: dict[str, str] = Field(default_factory=dict)
    operations: list[str] = Field(default_factory=list)


class EnvProfile(BaseModel):
    """One world's profile: ``name``, ``background`` (what the agent is and does there),
    ``entities`` and ``task_preferences`` (difficulty → what such a task involves)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    background: str
    entities: list[Entity]
    task_preferences: dict[str, str] = Field(default_factory=dict)

    def operations(self) -> list[str]:
        return sorted({op for entity in self.entities for op in entity.operations})


def _entity_of(tool_name: str) -> str:
    words = [w for w in re.split(r"[_\W]+", tool_name.lower()) if w]
    while len(words) > 1 and words[0] in VERBS:
        words = words[1:]
    return "_".join(words) or tool_name


def profile_from_tools(name: str, tools: list[ToolSpec], background: str = "") -> EnvProfile:
    """A profile derived from ``tools``: one entity per noun the tool names act on."""
    entities: dict[str, Entity] = {}
    for spec in tools:
        if spec.name in CONTROL_TOOLS:
            continue
        entity = entities.setdefault(_entity_of(spec.name), Entity(name=_entity_of(spec.name)))
        entity.operations.append(spec.name)
        for arg, schema in spec.parameters.get("properties", {}).items():
            entity.attributes.setdefault(arg, str(schema.get("description", schema.get("type", ""))))
        if spec.description and not entity.description:
            entity.description = spec.description
    return EnvProfile(
        name=name,
        background=background
        or f"An API world named {name!r} with the operations {', '.join(t.name for t in tools)}.",
        entities=list(entities.values()),
        task_preferences={
            "easy": "one entity, one or two operations",
            "medium": "two entities, three or four operations",
            "hard": "several entities and operations in one task",
        },
    )


def env_profile(env_name: str, options: dict[str, Any] | None = None) -> EnvProfile:
    """The profile of env ``env_name``: its own when it ships one, else derived from its tools."""
    from horizonrl.envs.registry import get_env_class, make_env, parse_env_options

    cls = get_env_class(env_name)
    own = getattr(cls, "profile", None)
    if callable(own):
        return EnvProfile.model_validate(own())
    env = make_env(env_name, parse_env_options(env_name, options or {}))
    return profile_from_tools(env_name, list(env.tools), (cls.__doc__ or "").strip().split("\n")[0])
