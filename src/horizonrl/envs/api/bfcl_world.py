"""The Berkeley Function Calling Leaderboard's multi-turn worlds, and its rule for a correct episode.

This module is the pure logic of the ``bfcl`` env (:mod:`.bfcl`): loading BFCL's API classes, tool
docs and tasks from the ``bfcl-eval`` package (installed ``--no-deps``; nothing is fetched), turning
its ground-truth call strings into structured calls, executing calls on live API instances, and
checking each user turn exactly as ``bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker``
does.

Loaded: the eight classes of BFCL's multi-turn categories (:data:`CLASSES`), plain Python (MathAPI
uses ``mpmath``). Left out (:data:`LEFT_OUT`): ``WebSearchAPI`` (it needs the network — SerpAPI —
and the ``serpapi``/``bs4``/``html2text`` packages) and the Memory APIs (``MemoryAPI_kv``,
``_vector``, ``_rec_sum``: BM25 and sentence-transformers + faiss stores, the ``overrides`` package;
they belong to BFCL's agentic memory category, not to the multi-turn ones).

BFCL's rule for one user turn, when the turn's ground truth is not empty (an empty one is not
checked): the model made at least one call in the turn; afterwards every API instance's public
state (``vars()`` without ``_``-names) equals the ground-truth instance's, which has run the
ground-truth calls of every turn so far; and every ground-truth result of this turn appears, as a
multiset, among all the model's results of the episode so far. An episode is correct when every
turn is.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from horizonrl.errors import ConfigError
from horizonrl.types import ToolSpec

BFCL_VERSION = "2026.3.23"
INSTALL_HINT = f"pip install --no-deps bfcl-eval=={BFCL_VERSION} (or make setup)"
CATEGORY = "multi_turn_base"
_SOURCE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"

#: BFCL's multi-turn API classes: (module under ``func_source_code``, tool-doc file)
CLASSES: dict[str, tuple[str, str]] = {
    "GorillaFileSystem": ("gorilla_file_system", "gorilla_file_system.json"),
    "MathAPI": ("math_api", "math_api.json"),
    "MessageAPI": ("message_api", "message_api.json"),
    "TwitterAPI": ("posting_api", "posting_api.json"),
    "TicketAPI": ("ticket_api", "ticket_api.json"),
    "TradingBot": ("trading_bot", "trading_bot.json"),
    "TravelAPI": ("travel_booking", "travel_booking.json"),
    "VehicleControlAPI": ("vehicle_control", "vehicle_control.json"),
}
#: bfcl-eval's other API classes, and why they are not loaded
LEFT_OUT: dict[str, str] = {
    "WebSearchAPI": "needs the network (SerpAPI) and the serpapi, bs4 and html2text packages",
    "MemoryAPI_kv, MemoryAPI_vector, MemoryAPI_rec_sum": "BM25 and sentence-transformers + faiss stores "
    "and the overrides package; BFCL's agentic memory category, not a multi-turn one",
}
#: classes without state (no ``_load_scenario``)
STATELESS = frozenset({"MathAPI"})
#: names BFCL refuses to execute
FORBIDDEN = frozenset({"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"})
#: BFCL doc types that JSON schema spells differently; "any" drops the type
_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
#: MathAPI arguments that would stall the event loop for minutes (BFCL would run them)
_PRECISION_LIMIT = 1000
_EXPONENT_LIMIT = 10_000


def require_bfcl() -> None:
    """ConfigError (one line, with the install command) when ``bfcl_eval`` cannot be imported."""
    try:
        importlib.import_module("bfcl_eval")
    except ImportError:
        raise ConfigError(f"env 'bfcl' needs the bfcl-eval package: {INSTALL_HINT}") from None


def api_class(name: str) -> type:
    """The BFCL API class ``name`` (one of :data:`CLASSES`)."""
    require_bfcl()
    if name not in CLASSES:
        raise ConfigError(
            f"bfcl class {name!r} is not loaded (loaded: {', '.join(CLASSES)}; left out: "
            f"{', '.join(LEFT_OUT)})"
        )
    return getattr(importlib.import_module(f"{_SOURCE}.{CLASSES[name][0]}"), name)


def _data_text(*parts: str) -> str:
    require_bfcl()
    return resources.files("bfcl_eval").joinpath("data", *parts).read_text(encoding="utf-8")


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------- tool docs
def convert_schema(schema: Any) -> Any:
    """A BFCL parameter schema as JSON schema: ``dict``→``object``, ``float``→``number``,
    ``tuple``→``array``, ``any``→ no type; recursing into ``properties`` and ``items``; a default
    written ``"None"`` becomes null. Every other key (description, required, enum…) is kept."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type":
            if value != "any":
                out["type"] = _TYPES.get(value, value)
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {name: convert_schema(prop) for name, prop in value.items()}
        elif key == "items":
            out["items"] = convert_schema(value)
        elif key == "default" and value == "None":
            out["default"] = None
        else:
            out[key] = value
    return out


def to_tool_spec(doc: Mapping[str, Any]) -> ToolSpec:
    """One BFCL function doc (name, description, parameters, response) as a ToolSpec."""
    params = convert_schema(doc.get("parameters") or {"type": "dict", "properties": {}})
    params.setdefault("type", "object")
    params.setdefault("properties", {})
    return ToolSpec(name=doc["name"], description=doc.get("description", ""), parameters=params)


@cache
def class_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """BFCL's function docs of one API class."""
    if class_name not in CLASSES:
        api_class(class_name)  # the error naming the loaded classes
    return tuple(_json_lines(_data_text("multi_turn_func_doc", CLASSES[class_name][1])))


@cache
def _tool_specs(involved: tuple[str, ...], excluded: frozenset[str]) -> tuple[ToolSpec, ...]:
    return tuple(
        to_tool_spec(doc) for name in involved for doc in class_docs(name) if doc["name"] not in excluded
    )


def tool_specs(involved: Sequence[str], excluded: Sequence[str] = ()) -> list[ToolSpec]:
    """The tools a task shows: the docs of its involved classes, less its excluded functions."""
    return [spec.model_copy(deep=True) for spec in _tool_specs(tuple(involved), frozenset(excluded))]


# ---------------------------------------------------------------------------------------- call strings
class CallParseError(ValueError):
    """A ground-truth call string that is not ``name(literal args)``."""


@cache
def class_signatures(class_name: str) -> dict[str, inspect.Signature]:
    """The public methods of an API class and their signatures (bound: without ``self``)."""
    instance = api_class(class_name)()
    return {
        name: inspect.signature(method)
        for name, method in inspect.getmembers(instance, predicate=inspect.ismethod)
        if not name.startswith("_")
    }


def task_signatures(involved: Sequence[str]) -> dict[str, inspect.Signature]:
    """The method signatures of a task's classes (a later class wins a name, as in BFCL)."""
    out: dict[str, inspect.Signature] = {}
    for name in involved:
        out.update(class_signatures(name))
    return out


def _literal(node: ast.expr, text: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise CallParseError(
            f"call {text!r}: argument {ast.unparse(node)!r} is not a Python literal"
        ) from None


def parse_call(text: str, signatures: Mapping[str, inspect.Signature] | None = None) -> dict[str, Any]:
    """A call string such as ``cd(folder='document')`` or ``sort('final_report.pdf')`` as
    ``{"name", "arguments"}``; positional arguments get their parameter names from ``signatures``
    (the method's bound signature). Values must be Python literals; CallParseError otherwise."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise CallParseError(f"call {text!r} is not Python: {exc.msg}") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise CallParseError(f"call {text!r} is not a call of a function name, e.g. cd(folder='document')")
    name = node.func.id
    arguments: dict[str, Any] = {}
    if node.args:
        signature = (signatures or {}).get(name)
        if signature is None:
            raise CallParseError(f"call {text!r}: positional arguments of unknown function {name!r}")
        positional = [
            p.name
            for p in signature.parameters.values()
            if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
        if len(node.args) > len(positional):
            raise CallParseError(
                f"call {text!r}: {name} takes at most {len(positional)} positional arguments"
            )
        for param, arg in zip(positional, node.args, strict=False):
            arguments[param] = _literal(arg, text)
    for keyword in node.keywords:
        if keyword.arg is None:
            raise CallParseError(f"call {text!r}: **-arguments are not supported")
        if keyword.arg in arguments:
            raise CallParseError(f"call {text!r}: argument {keyword.arg!r} is given twice")
        arguments[keyword.arg] = _literal(keyword.value, text)
    return {"name": name, "arguments": arguments}


# ---------------------------------------------------------------------------------------- tasks
@cache
def _entries() -> tuple[tuple[dict[str, Any], dict[str, Any]], ...]:
    questions = _json_lines(_data_text(f"BFCL_v4_{CATEGORY}.json"))
    answers = {a["id"]: a for a in _json_lines(_data_text("possible_answer", f"BFCL_v4_{CATEGORY}.json"))}
    return tuple((q, answers[q["id"]]) for q in questions)


def num_tasks() -> int:
    return len(_entries())


def task_data(n: int) -> list[tuple[str, dict[str, Any]]]:
    """The first ``n`` tasks of multi_turn_base (file order) as ``(id, data)``."""
    out = []
    for question, answer in _entries()[:n]:
        involved = list(question["involved_classes"])
        signatures = task_signatures(involved)
        truth = [list(turn) for turn in answer["ground_truth"]]
        turns = [[dict(m) for m in turn] for turn in question["question"]]
        data = {
            "query": turns[0][0]["content"] if turns and turns[0] else "",
            "turns": turns,
            "initial_config": copy.deepcopy(question.get("initial_config", {})),
            "involved_classes": involved,
            "excluded_function": list(question.get("excluded_function", [])),
            "ground_truth": truth,
            "reference_solution": [[parse_call(call, signatures) for call in turn] for turn in truth],
            "category": CATEGORY,
        }
        out.append((question["id"], data))
    return out


# ---------------------------------------------------------------------------------------- execution
def stringify(value: Any) -> str:
    """A call's result as BFCL records it: a str as is, a dict as JSON (else ``str``), else ``str``."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except Exception:  # BFCL falls back to str() for whatever json cannot write
            return str(value)
    return str(value)


@dataclass
class CallResult:
    text: str  # what the model sees and the checker compares
    raised: bool = False  # unknown function, bad arguments, or the method raised
    api_error: bool = False  # the API answered with {"error": ...}


def _too_large(class_name: str, name: str, arguments: Mapping[str, Any]) -> str | None:
    """Why a MathAPI call would run for minutes (huge precision or integer power), or None."""
    if class_name != "MathAPI":
        return None
    precision = arguments.get("precision")
    if name in ("logarithm", "square_root") and _number(precision) and precision > _PRECISION_LIMIT:
        return f"precision above {_PRECISION_LIMIT} is not supported"  # mpmath works to that many digits
    base, exponent = arguments.get("base"), arguments.get("exponent")
    if name == "power" and _number(base) and _number(exponent) and abs(exponent) > _EXPONENT_LIMIT:
        return f"exponents above {_EXPONENT_LIMIT} are not supported"
    return None


def _number(value: Any) -> bool:
    """An int or a float (``7546009.0`` runs as long as ``7546009``), not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class BfclWorld:
    """Live instances of a task's API classes (fresh, loaded with the task's initial config)."""

    def __init__(self, involved_classes: Sequence[str], initial_config: Mapping[str, Any]) -> None:
        self.instances: dict[str, Any] = {}
        self._methods: dict[str, tuple[str, Callable[..., Any]]] = {}
        for class_name in involved_classes:
            instance = api_class(class_name)()
            if class_name not in STATELESS:
                instance._load_scenario(copy.deepcopy(initial_config.get(class_name, {})), long_context=False)
            self.instances[class_name] = instance
            for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not name.startswith("_"):
                    self._methods[name] = (class_name, method)  # a later class wins, as in BFCL

    def call(self, name: str, arguments: Mapping[str, Any]) -> CallResult:
        """Run one call; every failure is an ``Error during execution: ...`` result, never raised."""
        if name in FORBIDDEN:
            return CallResult(f"Error during execution: Function call {name} is not allowed.", raised=True)
        if name not in self._methods:
            return CallResult(f"Error during execution: name {name!r} is not defined", raised=True)
        class_name, method = self._methods[name]
        if not isinstance(arguments, Mapping):
            return CallResult("Error during execution: arguments must be an object", raised=True)
        too_large = _too_large(class_name, name, arguments)
        if too_large:
            return CallResult(f"Error during execution: {too_large}", raised=True)
        try:  # a copy: an API may keep (and later change) an argument's list in its state
            value = method(**copy.deepcopy(dict(arguments)))
        except Exception as exc:  # an API failing is an observation, as in BFCL
            return CallResult(f"Error during execution: {exc}", raised=True)
        return CallResult(stringify(value), api_error=isinstance(value, dict) and "error" in value)


_MISSING = object()


def state_differences(model: Any, truth: Any) -> list[str]:
    """The public attributes of ``truth`` (``vars()``, no ``_``-names) whose values differ in
    ``model``: BFCL's state check."""
    return [
        attr
        for attr, value in vars(truth).items()
        if not attr.startswith("_") and getattr(model, attr, _MISSING) != value
    ]


def missing_results(truth: Sequence[str], model: Sequence[str]) -> list[str]:
    """The ground-truth results not found among ``model``'s, each model result used once."""
    pool = list(model)
    missing = []
    for item in truth:
        try:
            pool.remove(item)
        except ValueError:
            missing.append(item)
    return missing


@dataclass
class TurnVerdict:
    turn: int
    valid: bool
    reason: str = ""


@dataclass
class BfclEpisode:
    """One episode: the model's world, the ground truth's world, and the verdict of every turn.

    ``execute`` runs a model call (on the model's instances); ``end_turn`` closes the current user
    turn: it runs the turn's reference calls on the ground-truth instances and applies BFCL's check.
    """

    involved_classes: list[str]
    initial_config: dict[str, Any]
    reference: list[list[dict[str, Any]]]  # per turn, the ground truth's {name, arguments}
    model: BfclWorld = field(init=False)
    truth: BfclWorld = field(init=False)
    results: list[str] = field(default_factory=list)  # every model result of the episode, in order
    turn_calls: int = 0  # the model's calls in the current turn
    verdicts: list[TurnVerdict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.model = BfclWorld(self.involved_classes, self.initial_config)
        self.truth = BfclWorld(self.involved_classes, self.initial_config)

    @property
    def turn(self) -> int:
        """The index of the current user turn."""
        return len(self.verdicts)

    @property
    def done(self) -> bool:
        return self.turn == len(self.reference) or any(not v.valid for v in self.verdicts)

    @property
    def passed(self) -> bool:
        """Every turn was checked and passed."""
        return len(self.verdicts) == len(self.reference) and all(v.valid for v in self.verdicts)

    def execute(self, name: str, arguments: Mapping[str, Any]) -> CallResult:
        result = self.model.call(name, arguments)
        self.results.append(result.text)
        self.turn_calls += 1
        return result

    def end_turn(self) -> TurnVerdict:
        if self.done:
            raise RuntimeError("the episode is over")
        calls = self.reference[self.turn]
        truth_results = [self.truth.call(c["name"], c.get("arguments") or {}).text for c in calls]
        verdict = TurnVerdict(self.turn, True)
        if calls:  # BFCL does not check a turn whose ground truth is empty
            verdict = self._check(truth_results)
        self.verdicts.append(verdict)
        self.turn_calls = 0
        return verdict

    def _check(self, truth_results: list[str]) -> TurnVerdict:
        turn = self.turn
        if self.turn_calls == 0:
            return TurnVerdict(turn, False, "no tool call in this turn")
        for class_name, truth in self.truth.instances.items():
            differ = state_differences(self.model.instances[class_name], truth)
            if differ:
                return TurnVerdict(
                    turn,
                    False,
                    f"the state of {class_name} differs from the reference's: {', '.join(differ)}",
                )
        missing = missing_results(truth_results, self.results)
        if missing:
            shown = "; ".join(m[:120] for m in missing[:3])
            return TurnVerdict(turn, False, f"{len(missing)} reference result(s) never produced: {shown}")
        return TurnVerdict(turn, True)
