"""verifiers' envs, run as they are: ``env.name: verifiers:<taskset>`` or ``verifiers:<env>+<taskset>``
(verifiers' own pairing of an env with a taskset); ``<taskset>`` is what verifiers' loader takes (a
built-in taskset, an installed taskset package) or, beyond it, a dotted module or a ``.py`` file that
exports a ``vf.Taskset`` subclass in ``__all__``.

verifiers 0.4 (``verifiers.v1``) runs an episode itself; the adapter hands it each episode and plays
one seat with the agent loop (:mod:`.verifiers_host`). A task is one row of the taskset's task data
(``env.tasks_file``, validated by the taskset's own model; else its ``load()``, kept off the network);
``reset`` returns the seat's first model call's messages and tools, each ``step`` answers one call
with the reply and returns what verifiers added before the next (tool results, the env's user turns),
``done`` is ``run_episode`` returning, and ``evaluate`` is the trace's reward as verifiers scored it
(a run the agent loop ends first is stopped and scored as at a verifiers limit). A failed episode ends
``error`` with verifiers' error line. docs/envs.md ("verifiers") has the whole mapping and what does
not map.
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, ValidationError

from horizonrl.envs.base import Env, EnvOptions
from horizonrl.envs.foreign import import_file, offline, reached, read_rows
from horizonrl.errors import ConfigError, DataError, UnknownEnvError, read_user_text
from horizonrl.types import Action, Message, StepResult, Task, ToolCall, ToolSpec

EXTRA = "verifiers"
IMPORT = "verifiers"
PREFIX = "verifiers"
STOP_REASON = "horizonrl_agent_ended"
_TASK_KEYS = {"id", "env", "data"}


class VerifiersError(RuntimeError):
    """A verifiers episode failed; the message names the env and ends with verifiers' error line."""


class VerifiersOptions(EnvOptions):
    """Options of a verifiers env (``env.options``)."""

    taskset: dict[str, Any] = Field(
        default_factory=dict,
        description="The taskset's config, as verifiers' --env.taskset.* takes it (e.g. {game: Wordle-v0}).",
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="More of the verifiers env's config (its [env] block: seats, timeouts, retries); the "
        "policy's seat is set by the adapter, every other seat needs its own model and client here.",
    )
    seat: str | None = Field(None, description="The seat the policy plays (default: the env's only seat).")


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _vf() -> Any:
    import verifiers.v1 as vf

    return vf


# ---------------------------------------------------------------- which taskset
def env_ids() -> list[str]:
    """verifiers' built-in tasksets (found without importing verifiers' heavy modules); any installed
    taskset package, dotted module or .py file works as well."""
    spec = importlib.util.find_spec(IMPORT)
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(next(iter(spec.submodule_search_locations))) / "v1" / "tasksets"
    return sorted(p.name for p in root.iterdir() if (p / "__init__.py").is_file())


def _register_module(vf_id: str, module: Any) -> None:
    """Let verifiers' loader find ``module`` as taskset ``vf_id``: it looks in
    ``verifiers.v1.tasksets.<id>`` first, and takes only top-level modules otherwise."""
    sys.modules.setdefault(f"verifiers.v1.tasksets.{vf_id}", module)


def _load_file(path: Path) -> str:
    """Import the taskset file ``path`` (once) and register it under its stem; the stem is its id."""
    path, vf_id = path.resolve(), path.stem.lower()
    name = f"verifiers.v1.tasksets.{vf_id}"
    if name in sys.modules:
        known = Path(getattr(sys.modules[name], "__file__", "") or "").resolve()
        if known != path:
            raise ValueError(f"a taskset named {vf_id!r} is loaded already (from {known}); rename the file")
        return vf_id
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    if importlib.util.find_spec(name) is not None:
        raise ValueError(f"{vf_id!r} is the name of a built-in verifiers taskset; rename the file")
    _register_module(vf_id, import_file(path, f"horizonrl_verifiers_{vf_id}"))
    return vf_id


def _taskset_id(spec: str) -> str:
    """The id verifiers' loader resolves for ``spec`` (a file or dotted module is imported here and
    registered under it); UnknownEnvError in one line when it names no taskset."""
    valid = (
        f"give a built-in taskset ({', '.join(env_ids()) or 'none'}), an installed taskset package, a "
        "dotted module or a .py file that exports a verifiers Taskset in __all__"
    )
    try:
        if spec.endswith(".py"):
            vf_id = _load_file(Path(spec))
        elif "." in spec and "/" not in spec:
            vf_id = spec.lower()
            _register_module(vf_id, importlib.import_module(spec))
        else:
            vf_id = spec
        from verifiers.v1.utils.loaders import taskset_class

        taskset_class(vf_id)
    except Exception as exc:  # any failure to load is the spec's problem, in one line
        raise UnknownEnvError(
            f"unknown verifiers env {spec!r}: {_one_line(f'{type(exc).__name__}: {exc}')[:400]}; {valid}"
        ) from None
    return vf_id


def env_class(env_id: str) -> type[Env]:
    """The adapter class bound to ``env_id`` (``<taskset>`` or ``<env>+<taskset>``)."""
    vf_env, _, taskset = env_id.rpartition("+")
    vf_id = _taskset_id(taskset.strip())
    if vf_env:
        try:
            from verifiers.v1.utils.loaders import environment_class

            environment_class(vf_id, vf_env.strip())
        except Exception as exc:
            raise UnknownEnvError(
                f"unknown verifiers env {vf_env!r} in {env_id!r}: {_one_line(exc)[:400]}; give a built-in "
                "env (best_of_n, user_sim, ...) or an installed env package, then +<taskset>"
            ) from None
    attrs = {
        "name": f"{PREFIX}:{env_id}",
        "taskset_id": vf_id,
        "vf_env_id": vf_env.strip(),
        "text_actions": not _declares_tools(vf_id),
    }
    return type(f"Verifiers[{env_id}]", (VerifiersEnv,), attrs)


def _declares_tools(vf_id: str) -> bool:
    """Whether the taskset's tasks can have tool servers (its Task or Taskset class defines
    ``toolsets``); without, every reply is plain text for verifiers."""
    from verifiers.v1.utils.loaders import taskset_class

    vf = _vf()
    taskset = taskset_class(vf_id)
    task = taskset.task_type()
    return (
        task.toolsets.__func__ is not vf.Task.toolsets.__func__
        or taskset.toolsets.__func__ is not vf.Taskset.toolsets.__func__
    )


# ---------------------------------------------------------------- the env
def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones (images have no place here)
        texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "\n".join(texts)
    return "" if content is None else str(content)


def _message(raw: dict[str, Any]) -> Message:
    """A verifiers wire message (OpenAI chat format) as this project's Message."""
    role = {"developer": "system"}.get(raw.get("role", ""), raw.get("role", ""))
    if role not in ("system", "user", "assistant", "tool"):
        raise VerifiersError(f"a verifiers env sent a message with role {raw.get('role')!r}")
    calls = []
    for call in raw.get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except json.JSONDecodeError:
            arguments = {}
        calls.append(
            ToolCall(
                id=call.get("id", ""),
                name=function.get("name", ""),
                arguments=arguments if isinstance(arguments, dict) else {},
            )
        )
    return Message(
        role=role,
        content=_text(raw.get("content")),
        tool_calls=calls or None,
        tool_call_id=raw.get("tool_call_id") if role == "tool" else None,
        name=raw.get("name") if role == "tool" else None,
    )


def _tool_spec(raw: dict[str, Any]) -> ToolSpec | None:
    function = raw.get("function") if raw.get("type", "function") == "function" else None
    if not isinstance(function, dict) or not function.get("name"):
        return None
    return ToolSpec(
        name=function["name"],
        description=function.get("description") or "",
        parameters=function.get("parameters") or {"type": "object", "properties": {}},
    )


class VerifiersEnv(Env[VerifiersOptions]):
    """One episode of a verifiers env (the subclass made by :func:`env_class` says which)."""

    Options = VerifiersOptions
    #: the reply goes to verifiers as it is: an env without tool servers gets every reply as text
    #: (``text_actions``, set per env by :func:`env_class`; verifiers has no per-turn parser verdict,
    #: its rewards read the replies); one with tools gets the tool calls the model wrote, and a reply
    #: without any as text, which ends verifiers' chat loop as it does there
    accepts_text = True
    taskset_id: ClassVar[str] = ""
    vf_env_id: ClassVar[str] = ""

    def __init__(self, options: VerifiersOptions | None = None) -> None:
        super().__init__(options)
        self.run: Any = None  # the EpisodeRun on the host
        self.outcome: Any = None
        self.seen = 0  # messages of verifiers' conversation already in ours
        self.offered_tools = False

    # ------------------------------------------------------------ config and tasks
    @classmethod
    def config(cls, options: VerifiersOptions) -> Any:
        """verifiers' env config for ``options``, with the policy's seat on this project's harness."""
        return _config(cls.name, cls.taskset_id, cls.vf_env_id, _key(options))

    @classmethod
    def _data_help(cls, options: VerifiersOptions) -> str:
        data_type = _task_type(cls.config(options)).data_type()
        base = set(_vf().TaskData.model_fields) - {"prompt", "system_prompt", "id", "name"}
        fields = [
            f"{name}{' (required)' if info.is_required() else ''}"
            for name, info in data_type.model_fields.items()
            if name not in base
        ]
        return f"one JSON object per line with the fields of {data_type.__name__}: {', '.join(fields)}"

    @classmethod
    def make_tasks(cls, split: str, n: int, seed: int, options: VerifiersOptions) -> list[Task]:
        """``n`` tasks from the taskset's own ``load()`` (shuffled by verifiers with ``seed`` when the
        taskset is finite; verifiers tasksets have no splits), which may not use the network."""
        config = cls.config(options)
        from verifiers.v1.utils.loaders import load_taskset

        try:
            with offline():
                taskset = load_taskset(config.taskset)
                view = taskset.shuffle(seed).take(n) if taskset.bounded else taskset.take(n)
                tasks = list(view)
        except Exception as exc:
            host = reached()
            why = (
                f"its taskset loads its data from the network (it asked for {host}), and nothing is "
                "downloaded at run time"
                if host
                else f"its taskset failed to load ({_one_line(f'{type(exc).__name__}: {exc}')[:300]})"
            )
            raise DataError(
                f"env {cls.name!r}: {why}; give its rows as env.tasks_file=ROWS.jsonl (or .parquet), "
                f"{cls._data_help(options)}"
            ) from None
        if not tasks:
            raise DataError(
                f"env {cls.name!r}: its taskset has no tasks; give rows as env.tasks_file=ROWS.jsonl"
            )
        return [
            cls._task(t.data, split, t.data.id or t.data.name or f"{cls.taskset_id}-{t.data.idx}")
            for t in tasks
        ]

    @classmethod
    def _task(cls, data: Any, split: str, task_id: str) -> Task:
        return Task(
            id=str(task_id),
            env=cls.name,
            split=split,
            data=data.model_dump(mode="json", exclude_defaults=True),
        )

    @classmethod
    def read_tasks(cls, path: Path, options: VerifiersOptions) -> list[Task]:
        """The taskset's task data rows in ``path`` (JSONL, or Parquet), each validated by the
        taskset's own data model; a row's ``split`` key (not a task field) says its split. A line
        that is already a Task is taken as it is."""
        config = cls.config(options)
        data_type = _task_type(config).data_type()
        prompt_file = config.taskset.system_prompt
        override = read_user_text(prompt_file, "env.options.taskset.system_prompt") if prompt_file else None
        tasks = []
        for index, (where, row) in enumerate(read_rows(path, "verifiers task data")):
            if not isinstance(row, dict):
                raise DataError(f"{where}: not a JSON object; {cls._data_help(options)}")
            if row.keys() >= _TASK_KEYS and "prompt" not in row:
                try:
                    tasks.append(Task.model_validate(row))
                except ValidationError as exc:
                    raise DataError(
                        f"{where}: not a valid task: {_one_line(exc.errors()[0]['msg'])}"
                    ) from None
                continue
            row = dict(row)
            split = str(row.pop("split", None) or "train")
            try:
                data = data_type.model_validate({**row, "idx": index})
            except ValidationError as exc:
                err = exc.errors()[0]
                key = ".".join(str(p) for p in err["loc"]) or "(row)"
                raise DataError(
                    f"{where}: {key}: {_one_line(err['msg'])}; {cls._data_help(options)}"
                ) from None
            if override is not None:
                data = data.model_copy(update={"system_prompt": override})
            tasks.append(cls._task(data, split, data.id or data.name or f"{path.stem}-{index + 1}"))
        if not tasks:
            raise DataError(f"{path}: holds no rows; {cls._data_help(options)}")
        return tasks

    # ------------------------------------------------------------ the episode
    async def reset(self, task: Task) -> list[Message]:
        from horizonrl.envs.foreign import verifiers_host as vh

        self.metrics, self.outcome, self.seen = {}, None, 0
        config = self.config(self.options)
        host = vh.Host.get()

        def make() -> Any:
            with offline():
                return _vf().load_environment(config)

        env = await host.call(host.env(self.name + _key(self.options), make))
        task_type = type(env.taskset).task_type()
        try:
            data = task_type.data_type().model_validate(task.data)
        except ValidationError as exc:
            raise VerifiersError(
                f"task {task.id!r} is not task data of {self.name!r}: {_one_line(exc.errors()[0]['msg'])}"
            ) from None
        self.run = vh.EpisodeRun(host, env, task_type(data, env.taskset.config.task))
        event = await host.call(self.run.start())
        if isinstance(event, vh.Outcome):
            self.outcome = event
            raise VerifiersError(
                f"verifiers env {self.name!r} ended before the policy's first turn"
                + (f": {event.error}" if event.error else "")
            )
        messages = [_message(m) for m in event.messages]
        self._take(event)
        return messages

    def _take(self, request: Any) -> None:
        if request.tools and self.text_actions:
            raise VerifiersError(
                f"verifiers env {self.name!r} offered tools although its task type declares no tool servers"
            )
        self.seen = len(request.messages)
        self.offered_tools = bool(request.tools)
        self.tools = [spec for spec in map(_tool_spec, request.tools) if spec is not None]

    async def step(self, action: Action) -> StepResult:
        from horizonrl.envs.foreign import verifiers_host as vh

        if self.run is None:
            raise RuntimeError("step() before reset()")
        reply: dict[str, Any] = {"role": "assistant", "content": action.text}
        if self.offered_tools and action.tool_calls:
            reply["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in action.tool_calls
            ]
        event = await vh.Host.get().call(self.run.reply(reply))
        if isinstance(event, vh.Outcome):
            self.outcome = event
            if event.error:
                raise VerifiersError(f"verifiers env {self.name!r} failed: {event.error}")
            return StepResult(done=True)
        conversation = event.messages
        if len(conversation) <= self.seen or conversation[self.seen].get("role") != "assistant":
            raise VerifiersError(
                f"verifiers env {self.name!r} changed the conversation's history (e.g. compacted it); the "
                "agent loop's record holds every token, so it takes only a conversation that grows"
            )
        observations = [_message(m) for m in conversation[self.seen + 1 :]]
        self._take(event)
        return StepResult(observations=observations)

    async def evaluate(self) -> float | None:
        """The seat trace's reward as verifiers scored it (a run the agent loop ended first is
        stopped and scored as at a verifiers limit)."""
        from horizonrl.envs.foreign import verifiers_host as vh

        if self.outcome is None and self.run is not None:
            self.outcome = await vh.Host.get().call(self.run.stop(STOP_REASON))
        if self.outcome is None:
            return None
        if self.outcome.error:
            raise VerifiersError(f"verifiers env {self.name!r} failed: {self.outcome.error}")
        self.metrics.update(self.outcome.metrics)
        return self.outcome.reward

    async def close(self) -> None:
        from horizonrl.envs.foreign import verifiers_host as vh

        run, self.run = self.run, None
        if run is not None and self.outcome is None:
            await vh.Host.get().call(run.cancel())


@functools.cache
def _config(name: str, taskset_id: str, vf_env_id: str, options_json: str) -> Any:
    """verifiers' env config (validated by verifiers) with the policy's seat on this project's
    harness and a local runtime; ConfigError names what is wrong (made once per options)."""
    from verifiers.v1.configs.agent import agent_config_fields

    from horizonrl.envs.foreign.verifiers_host import HARNESS_ID

    vf = _vf()
    options = json.loads(options_json)
    raw = copy.deepcopy(options["config"])
    raw["taskset"] = {**(raw.get("taskset") or {}), **options["taskset"], "id": taskset_id}
    if vf_env_id:
        raw["id"] = vf_env_id

    def resolve(what: str) -> Any:
        try:
            return vf.resolve_env_config(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(str(p) for p in err["loc"])
            raise ConfigError(f"env {name!r}: env.options.{what}: {key}: {_one_line(err['msg'])}") from None
        except Exception as exc:
            raise ConfigError(f"env {name!r}: env.options.{what}: {_one_line(exc)[:400]}") from None

    seats = list(agent_config_fields(resolve("config")))
    seat = options["seat"] or (seats[0] if len(seats) == 1 else None)
    if seat not in seats:
        raise ConfigError(
            f"env {name!r}: env.options.seat={options['seat']!r}: the env's seats are {', '.join(seats)}; "
            "name the one the policy plays"
        )
    policy_seat = {
        "harness": {"id": HARNESS_ID},
        "runtime": {"type": "subprocess"},
        "model": None,
        "client": None,
    }
    raw[seat] = {**(raw.get(seat) or {}), **policy_seat}
    raw["interception"] = {"type": "server"}  # one server, where the policy's model client is set
    config = resolve("config")
    for other in seats:
        agent = getattr(config, other)
        if other != seat and (agent.model is None or agent.client is None):
            raise ConfigError(
                f"env {name!r}: the policy plays seat {seat!r}; seat {other!r} needs a model of its own: set "
                f"env.options.config.{other}.model and .client (an OpenAI-compatible endpoint)"
            )
    return config


def _key(options: VerifiersOptions) -> str:
    return json.dumps(options.model_dump(), sort_keys=True)


def _task_type(config: Any) -> Any:
    from verifiers.v1.utils.loaders import taskset_class

    return taskset_class(config.taskset.id).task_type()
