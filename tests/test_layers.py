"""Imports run down the layers and never in a circle (docs/architecture.md).

Every module under ``src/horizonrl`` is parsed with :mod:`ast` (nothing is imported) and every
``import``/``from ... import`` in it becomes an edge of the module graph: at module level, inside
functions and methods, and inside ``if TYPE_CHECKING:`` blocks. Typing-only imports count: a name a
module needs for its annotations is a dependency all the same, and ``if TYPE_CHECKING:`` is the usual
way a cycle is hidden rather than removed. ``from pkg import name`` is an edge to the submodule
``pkg.name`` when there is one, else to ``pkg``; the parent packages Python runs on the way to a
module (``horizonrl/engine/__init__.py`` before ``horizonrl/engine/hf.py``) are not edges, and neither
are modules named in strings (env entry points, ``module:Class`` references).

Two checks run over the graph:

- no import cycles: no strongly connected component of more than one module (Tarjan's algorithm);
- no import up the layers: :data:`LAYERS` gives every top-level module and package of ``horizonrl``
  a layer (the longest matching prefix wins), and a module imports only from its own layer or below.

The imports that break the rule today are listed in :data:`KNOWN_UPWARD` and :data:`KNOWN_CYCLES`.
Both lists only shrink: a violation not in them fails, and so does an entry that no longer happens
(``fixed: remove from KNOWN``).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "horizonrl"

#: The layers, bottom up (docs/architecture.md says what each is).
LAYER_NAMES = {
    0: "base",
    1: "parts",
    2: "agent",
    3: "rollout and services",
    4: "systems",
    5: "views",
    6: "CLI",
    7: "package face",
}

#: Every top-level module and package of horizonrl, and its layer (a key may also name a deeper
#: module; the longest prefix that matches a module's name gives its layer).
LAYERS: dict[str, int] = {
    # 0 base: the data types and the small leaf helpers every layer uses
    # the package face (horizonrl/__init__.py): the names a Python user needs, from every layer
    "horizonrl": 7,
    "horizonrl.types": 0,
    "horizonrl.errors": 0,
    "horizonrl.io": 0,
    "horizonrl.run_paths": 0,
    "horizonrl.algos": 0,
    "horizonrl.seeds": 0,
    "horizonrl.checksums": 0,
    "horizonrl.tokens": 0,
    "horizonrl.toolformats": 0,
    "horizonrl.toolcalls": 0,
    "horizonrl.chat": 0,
    "horizonrl.hardware": 0,
    "horizonrl.memory": 0,
    "horizonrl.asgi": 0,
    "horizonrl.yamlsafe": 0,
    "horizonrl.secret": 0,
    "horizonrl.stats": 0,
    "horizonrl.local_server": 0,
    "horizonrl.hf_quiet": 0,
    "horizonrl.model_config": 0,
    "horizonrl.optim": 0,
    "horizonrl.data_parallel": 0,
    # 1 parts: what an episode is made of, and the services below the agent
    "horizonrl.envs": 1,
    "horizonrl.engine": 1,
    "horizonrl.roles": 1,
    "horizonrl.sandbox": 1,
    "horizonrl.worlds": 1,
    "horizonrl.models": 1,
    "horizonrl.policy": 1,
    "horizonrl.trainable": 1,
    # 2 agent: the episode loop
    "horizonrl.agent": 2,
    # 3 rollout (many episodes) and the services systems are handed (workers, the policy server)
    "horizonrl.rollout": 3,
    "horizonrl.runtime": 3,
    "horizonrl.serve": 3,
    # 4 systems: what a command runs
    "horizonrl.train": 4,
    "horizonrl.stream": 4,
    "horizonrl.learn": 4,
    "horizonrl.evolve": 4,
    "horizonrl.multiagent": 4,
    "horizonrl.analysis": 4,
    # the recipe schema: it composes the sections the systems declare, and the systems take it
    "horizonrl.config": 4,
    # 5 views over what the systems wrote
    "horizonrl.view": 5,
    "horizonrl.report": 5,
    # 6 the command line
    "horizonrl.cli": 6,
}

#: Upward imports that exist today, ``importer -> imported``; only ever removed from.
KNOWN_UPWARD: set[str] = set()

#: Import cycles that exist today, each the set of its modules; only ever removed from (or
#: replaced by what is left of one).
KNOWN_CYCLES: list[frozenset[str]] = []


# ---------------------------------------------------------------------------------------- the checker
def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterable[tuple[str, str | None]]:
    """``(module, name)`` for every import anywhere in ``tree``: ``import a.b`` gives ``("a.b", None)``,
    ``from a import b`` gives ``("a", "b")``; relative imports resolved against ``module``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                yield source, alias.name


def import_graph(src: Path, package: str = PACKAGE) -> dict[str, set[str]]:
    """Every module of ``package`` under ``src`` and the modules of the package it imports."""
    files = {module_name(p, src): p for p in sorted((src / package).rglob("*.py"))}

    def resolve(dotted: str) -> str | None:
        while dotted not in files and "." in dotted:
            dotted = dotted.rsplit(".", 1)[0]
        return dotted if dotted in files else None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        targets = set()
        for source, name in imported_names(tree, module, path.name == "__init__.py"):
            if source != package and not source.startswith(package + "."):
                continue
            target = resolve(f"{source}.{name}" if name and f"{source}.{name}" in files else source)
            if target is not None and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def cycles(graph: Mapping[str, Iterable[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer_of(module: str, layers: Mapping[str, int] = LAYERS) -> int | None:
    """The layer of the longest key of ``layers`` that is ``module`` or a package above it."""
    parts = module.split(".")
    for cut in range(len(parts), 0, -1):
        key = ".".join(parts[:cut])
        if key in layers:
            return layers[key]
    return None


def upward(graph: Mapping[str, Iterable[str]], layer: Callable[[str], int | None]) -> dict[str, str]:
    """``{"a -> b": "a -> b (layer X -> layer Y)"}`` for every import of a higher layer's module."""
    found = {}
    for importer in sorted(graph):
        for imported in sorted(graph[importer]):
            low, high = layer(importer), layer(imported)
            if low is not None and high is not None and high > low:
                edge = f"{importer} -> {imported}"
                found[edge] = f"{edge} (layer {low} -> layer {high})"
    return found


def _cycle_text(component: frozenset[str]) -> str:
    return "{" + ", ".join(sorted(component)) + "}"


# ---------------------------------------------------------------------------------------- the tests
GRAPH = import_graph(SRC)


def test_every_module_has_a_layer() -> None:
    top = {
        f"{PACKAGE}.{p.stem}"
        for p in (SRC / PACKAGE).iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }
    missing = sorted(top - LAYERS.keys())
    assert not missing, (
        "modules without a layer (add them to LAYERS in tests/test_layers.py and to "
        "docs/architecture.md): " + ", ".join(missing)
    )
    stale = sorted(key for key in LAYERS if not any(m == key or m.startswith(key + ".") for m in GRAPH))
    assert not stale, "LAYERS names modules that do not exist: " + ", ".join(stale)
    assert {layer_of(m) for m in GRAPH} <= LAYER_NAMES.keys()


def test_imports_run_down_the_layers() -> None:
    found = upward(GRAPH, layer_of)
    for line in found.values():
        print(line + ("" if line.split(" (")[0] in KNOWN_UPWARD else "  NEW"))
    new = [line for edge, line in found.items() if edge not in KNOWN_UPWARD]
    assert not new, "imports up the layers (docs/architecture.md):\n" + "\n".join(new)


def test_known_upward_imports_still_happen() -> None:
    fixed = sorted(KNOWN_UPWARD - upward(GRAPH, layer_of).keys())
    assert not fixed, "\n".join(f"{edge}: fixed: remove from KNOWN_UPWARD" for edge in fixed)


def test_no_import_cycles() -> None:
    problems = []
    for component in cycles(GRAPH):
        print("cycle:", _cycle_text(component))
        if component in KNOWN_CYCLES:
            continue
        shrunk = [known for known in KNOWN_CYCLES if component < known]
        if shrunk:
            problems.append(
                f"cycle {_cycle_text(component)} is what is left of {_cycle_text(shrunk[0])}: "
                "replace that entry of KNOWN_CYCLES with it"
            )
        else:
            problems.append(f"import cycle: {_cycle_text(component)}")
    assert not problems, "\n".join(problems)


def test_known_cycles_still_happen() -> None:
    current = cycles(GRAPH)
    fixed = [known for known in KNOWN_CYCLES if known not in current and not any(c < known for c in current)]
    assert not fixed, "\n".join(f"cycle {_cycle_text(k)}: fixed: remove from KNOWN_CYCLES" for k in fixed)


# ---------------------------------------------------------------------- the checker, on known input
def test_checker_finds_cycles_and_only_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": set(), "f": {"f", "e"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
    assert sorted(map(sorted, cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}))) == [
        ["a", "b"],
        ["c", "d"],
    ]


def test_checker_finds_upward_imports() -> None:
    layers = {"p": 0, "p.low": 0, "p.high": 2, "p.high.leaf": 1}
    graph = {"p.low.x": {"p.high.y", "p.low.z"}, "p.high.y": {"p.low.x", "p.high.leaf"}, "p.high.leaf": set()}
    found = upward(graph, lambda m: layer_of(m, layers))
    assert list(found.values()) == ["p.low.x -> p.high.y (layer 0 -> layer 2)"]


def test_checker_reads_every_kind_of_import(tmp_path: Path) -> None:
    """Imports inside functions and ``if TYPE_CHECKING:`` count, relative imports resolve, and
    ``from pkg import sub`` names the submodule."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
        "b.py": "def f():\n    import pkg.sub.c\n",
        "sub/__init__.py": "from . import c\n",
        "sub/c.py": "from ..a import thing\nfrom pkg import sub\nimport json\n",
        "d.py": "from pkg.sub.c import name as other\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(tmp_path, "pkg")
    assert graph == {
        "pkg": set(),
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.sub.c"},
        "pkg.sub": {"pkg.sub.c"},
        "pkg.sub.c": {"pkg.a", "pkg.sub"},
        "pkg.d": {"pkg.sub.c"},
    }
    assert cycles(graph) == [frozenset({"pkg.a", "pkg.b", "pkg.sub.c", "pkg.sub"})]
