"""YAML read from a user's text with its aliases bounded: ``safe_load`` semantics (plain data only),
but a document whose aliases would expand to more than :data:`MAX_NODES` values (a "billion laughs"
bomb: a few hundred bytes that name one list nine times, nine levels deep), or that refers to itself,
is refused before anything is built from it. Aliases themselves stay allowed: a recipe that reuses a
block with ``&name`` / ``*name`` loads as before."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from horizonrl.errors import ConfigError

#: Most values (scalars, lists, mappings) a document may hold once every alias is expanded; a recipe
#: holds a few hundred.
MAX_NODES = 100_000


class YAMLBombError(ConfigError):
    """A YAML document whose aliases expand past :data:`MAX_NODES` values, or refer to themselves."""


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def check_expansion(root: Node, limit: int = MAX_NODES) -> None:
    """Raise YAMLBombError when ``root``, with every alias expanded, holds more than ``limit`` values
    or contains itself. Linear in the nodes the text really holds (each is sized once)."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[key] > limit:
                raise YAMLBombError(
                    f"its YAML aliases (*anchor) expand to more than {limit} values; a recipe needs "
                    "far fewer: write the repeated block out, or reuse it less"
                )
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise YAMLBombError("a YAML alias (*anchor) refers to a block that contains it; remove the loop")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that checks each document's alias expansion before constructing it."""

    def compose_document(self) -> Node | None:
        node = super().compose_document()
        if node is not None:
            check_expansion(node)
        return node


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)`` with the alias bound; YAMLError for malformed text (the caller names
    the file or override), YAMLBombError (a one-line ConfigError) for a bomb."""
    return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader subclass: plain data only
