"""skyrl-gym's envs, run as they are: ``env.name: skyrl_gym:<env id>`` (``gsm8k``, ``text2sql``, ...,
or ``skyrl_gym:<module>:<Class>`` for a ``skyrl_gym.Env`` subclass of your own).

A skyrl-gym env is text in, text out: ``init(prompt)`` gives the first chat messages and ``step(reply)``
parses the model's raw reply itself (``<sql>…</sql>``, ``#### 42``, a code block) and answers with
observations, a reward and ``done``. So the adapter is a text-action env (``Env.text_actions``): the
agent loop hands it every reply as it is. The mapping, as skyrl-train's generator does it:

- a task is one row of the env's dataset (``prompt``, ``env_class``, ``reward_spec``, ``extra_info``,
  ...), JSONL or Parquet, as ``env.tasks_file``; the env is made per episode with
  ``skyrl_gym.make(id, env_config=<env.options.env_config>, extras=<the row less prompt and env_class>)``;
- ``reset`` = ``init(prompt)``; ``step`` = ``step(reply)``: its observations, reward and done as they
  are, its metadata as ``StepResult.info``; the episode's reward is the sum of the step rewards;
- a reply the env's own parser cannot read is ``StepResult.malformed`` (its parser, called on the
  reply; envs without one known here never say so); ``get_metrics()`` and the last step's numeric
  metadata go into the record's ``metrics``;
- what the env raises ends the episode ``error`` whose last line names the env and the foreign
  exception; the rollout goes on.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, ValidationError

from horizonrl.envs.base import Env, EnvOptions
from horizonrl.envs.foreign import read_rows
from horizonrl.errors import DataError, HorizonError, UnknownEnvError
from horizonrl.types import Action, Message, StepResult, Task

EXTRA = "skyrl-gym"
IMPORT = "skyrl_gym"
PREFIX = "skyrl_gym"
ROW_HELP = (
    "a skyrl-gym dataset row is a JSON object with 'prompt' (a list of {role, content} messages) and the "
    "fields the env reads (e.g. reward_spec: {ground_truth}), as skyrl-train's datasets write them"
)


class SkyRLGymError(RuntimeError):
    """A skyrl-gym env raised; the message names the env, the call and the foreign exception."""


class SkyRLGymOptions(EnvOptions):
    """Options of a skyrl-gym env (``env.options``)."""

    env_config: dict[str, Any] = Field(
        default_factory=dict,
        description="The env's config as skyrl-train passes it (its skyrl_gym.<env id> block), e.g. "
        "{db_path: DIR} for text2sql.",
    )
    max_turns: int | None = Field(
        None,
        ge=1,
        description="Put into every task's extras as skyrl-train's generator.max_turns does (None: the "
        "row's own, else the env's default); keep agent.max_turns at least as large.",
    )
    in_thread: bool = Field(
        True,
        description="Run the env's init/step/close in a worker thread (they are synchronous: SQL, code "
        "execution); false runs them on the event loop, for envs that only compute a score.",
    )


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _skyrl_gym() -> Any:
    import skyrl_gym

    return skyrl_gym


def env_ids() -> list[str]:
    """The envs registered with skyrl-gym (its own, and any a loaded package registered)."""
    return sorted(_skyrl_gym().registry)


def _entry_point(env_id: str) -> str | None:
    """``module:Class`` for an env of the user's own (None for a registered id); UnknownEnvError
    when it does not name a skyrl_gym.Env subclass."""
    if ":" not in env_id:
        return None
    module_name, _, attr = env_id.partition(":")
    valid = f"give a registered id ({', '.join(env_ids())}) or module:Class of a skyrl_gym.Env subclass"
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # the spec's problem, in one line
        why = _one_line(f"{type(exc).__name__}: {exc}")
        raise UnknownEnvError(f"env '{PREFIX}:{env_id}': cannot load {env_id!r} ({why}); {valid}") from None
    if not (isinstance(obj, type) and issubclass(obj, _skyrl_gym().Env)):
        raise UnknownEnvError(f"env '{PREFIX}:{env_id}': {attr!r} is not a skyrl_gym.Env subclass; {valid}")
    return env_id


def env_class(env_id: str) -> type[Env]:
    """The adapter class bound to skyrl-gym's env ``env_id``."""
    entry = _entry_point(env_id)
    if entry is None and env_id not in _skyrl_gym().registry:
        valid = ", ".join(f"{PREFIX}:{i}" for i in env_ids())
        raise UnknownEnvError(
            f"unknown skyrl-gym env {env_id!r}; valid: {valid} (or {PREFIX}:module:Class of a skyrl_gym.Env)"
        )
    attrs = {"name": f"{PREFIX}:{env_id}", "env_id": env_id, "entry_point": entry}
    return type(f"SkyRLGym[{env_id}]", (SkyRLGymEnv,), attrs)


# ---------------------------------------------------------------- the envs' own parsers
def _gsm8k(env: Any, text: str) -> str | None:
    from skyrl_gym.envs.gsm8k.utils import extract_solution

    return None if extract_solution(text, method="strict") is not None else "no '#### <number>' answer"


def _aime(env: Any, text: str) -> str | None:
    from skyrl_gym.envs.aime.utils import is_correct_minerva

    pattern = inspect.signature(is_correct_minerva).parameters["answer_pattern"].default
    return None if re.findall(pattern, text[-300:]) else "no 'Answer: ...' line"


def _lcb(env: Any, text: str) -> str | None:
    from skyrl_gym.envs.lcb.livecodebench import extract_code_from_model

    return None if extract_code_from_model(text) is not None else "no ```code``` block"


def _sql(env: Any, text: str) -> str | None:
    if env._is_done(text) or env._parse_action(text)[2][1] is not None:
        return None
    return "neither <sql>...</sql> nor <solution>...</solution>"


def _search(env: Any, text: str) -> str | None:
    if env._is_done(text) or env._parse_action(text) != [None]:
        return None
    return "neither <search>...</search> nor <answer>...</answer>"


def _searchcode(env: Any, text: str) -> str | None:
    if env._is_done(text):
        return None
    try:
        env._parse_action(text)
    except ValueError as exc:
        return _one_line(exc)
    return None


#: env id -> its parser, asked whether it can read a reply (before the reply's step)
PARSERS: dict[str, Callable[[Any, str], str | None]] = {
    "gsm8k": _gsm8k,
    "gsm8k_multi_turn": _gsm8k,
    "aime": _aime,
    "lcb": _lcb,
    "text2sql": _sql,
    "search": _search,
    "searchcode": _searchcode,
}


#: env id -> the step reward that means solved, for envs whose rewards are shaped (the record's
#: ``success``; elsewhere a positive reward is a solved task, as in skyrl-gym's own envs)
SOLVED_AT: dict[str, float] = {"gsm8k_multi_turn": 1.0}  # 0.2/max_turns per well-formatted wrong answer


def _message(env_id: str, raw: Any) -> Message:
    if not isinstance(raw, dict) or not isinstance(raw.get("content", ""), str):
        raise SkyRLGymError(
            f"skyrl-gym env {env_id!r} gave a message that is not {{role, content: str}}: {raw!r:.200}"
        )
    try:
        return Message(role=raw.get("role"), content=raw.get("content") or "")
    except ValidationError:
        raise SkyRLGymError(
            f"skyrl-gym env {env_id!r} gave a message with role {raw.get('role')!r}; "
            "valid: system, user, assistant, tool"
        ) from None


def _numbers(values: dict[str, Any] | None) -> dict[str, float]:
    return {k: float(v) for k, v in (values or {}).items() if isinstance(v, int | float)}


class SkyRLGymEnv(Env[SkyRLGymOptions]):
    """One episode of a skyrl-gym env (the subclass made by :func:`env_class` says which)."""

    Options = SkyRLGymOptions
    text_actions = True
    env_id: ClassVar[str] = ""
    entry_point: ClassVar[str | None] = None

    def __init__(self, options: SkyRLGymOptions | None = None) -> None:
        super().__init__(options)
        self.env: Any = None
        self.env_metrics: dict[str, float] = {}

    # ------------------------------------------------------------ tasks
    @classmethod
    def make_tasks(cls, split: str, n: int, seed: int, options: SkyRLGymOptions) -> list[Task]:
        raise HorizonError(
            f"env {cls.name!r} reads its tasks from the env's dataset: give its rows (JSONL or Parquet) as "
            f"env.tasks_file=PATH; {ROW_HELP}"
        )

    @classmethod
    def read_tasks(cls, path: Path, options: SkyRLGymOptions) -> list[Task]:
        """The dataset rows in ``path`` (JSONL, or Parquet as skyrl-train writes them) as tasks; a
        line that is already a Task is taken as it is. The first row's env is made once, so a missing
        database or config is one line now rather than an error in every episode."""
        rows = read_rows(path, "skyrl-gym dataset", hint=ROW_HELP)
        if not rows:
            raise DataError(f"{path}: holds no rows; {ROW_HELP}")
        tasks = [cls._task(path, where, row) for where, row in rows]
        first = next(
            ((where, t) for (where, _), t in zip(rows, tasks, strict=True) if "prompt" in t.data), None
        )
        if first is not None:
            where, task = first
            try:
                cls._make(cls._extras(task.data, options), options).close()
            except Exception as exc:
                key = getattr(exc, "key", None) if type(exc).__name__ == "ConfigAttributeError" else None
                why = (
                    f"its config has no {key!r}: set env.options.env_config.{key}"
                    if key
                    else _one_line(f"{type(exc).__name__}: {exc}")
                )
                raise DataError(
                    f"{where}: env {cls.name!r} cannot start on this row: {why} (skyrl-gym downloads "
                    "nothing: supply the data it names, in the row or in env.options.env_config)"
                ) from None
        return tasks

    @classmethod
    def _task(cls, path: Path, where: str, row: Any) -> Task:
        if isinstance(row, dict) and "prompt" not in row and {"id", "env"} <= row.keys():
            try:
                return Task.model_validate(row)
            except ValidationError as exc:
                raise DataError(f"{where}: not a valid task: {_one_line(exc.errors()[0]['msg'])}") from None
        prompt = row.get("prompt") if isinstance(row, dict) else None
        if not (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in prompt)
        ):
            raise DataError(f"{where}: no 'prompt' list of chat messages; {ROW_HELP}")
        env_class_ = row.get("env_class")
        if cls.entry_point is None and env_class_ not in (None, cls.env_id):
            raise DataError(
                f"{where}: the row is for skyrl-gym env {env_class_!r}, but the config's env is {cls.name!r}"
            )
        info = row.get("extra_info")
        split = info.get("split") if isinstance(info, dict) else None
        return Task(
            id=f"{path.stem}-{where.rsplit(':', 1)[1]}", env=cls.name, split=str(split or "train"), data=row
        )

    # ------------------------------------------------------------ the foreign env
    @classmethod
    def _extras(cls, row: dict[str, Any], options: SkyRLGymOptions) -> dict[str, Any]:
        extras = copy.deepcopy({k: v for k, v in row.items() if k not in ("prompt", "env_class")})
        if options.max_turns is not None:
            extras["max_turns"] = options.max_turns
        return extras

    @classmethod
    def _make(cls, extras: dict[str, Any], options: SkyRLGymOptions) -> Any:
        from omegaconf import OmegaConf
        from skyrl_gym.envs.registration import EnvSpec

        skyrl_gym = _skyrl_gym()
        spec = EnvSpec(id=cls.env_id, entry_point=cls.entry_point) if cls.entry_point else cls.env_id
        return skyrl_gym.make(spec, env_config=OmegaConf.create(options.env_config), extras=extras)

    async def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, in a worker thread unless ``in_thread`` is off; what it raises becomes a
        SkyRLGymError whose message ends with the foreign exception's own last line."""
        try:
            if self.options.in_thread:
                return await asyncio.to_thread(fn, *args)
            return fn(*args)
        except Exception as exc:
            raise SkyRLGymError(
                f"skyrl-gym env {self.env_id!r} raised in {what}: {_one_line(f'{type(exc).__name__}: {exc}')}"
            ) from exc

    async def reset(self, task: Task) -> list[Message]:
        await self.close()  # an instance reused for another episode lets go of the last one's env
        self.metrics, self.env_metrics = {}, {}
        extras = self._extras(task.data, self.options)
        self.env = await self._call("make", self._make, extras, self.options)
        out = await self._call("init", self.env.init, copy.deepcopy(task.data.get("prompt")))
        chat = out[0] if isinstance(out, tuple) else out
        if not isinstance(chat, list) or not chat:
            raise SkyRLGymError(
                f"skyrl-gym env {self.env_id!r}: init() gave no messages ({type(chat).__name__})"
            )
        return [_message(self.env_id, m) for m in chat]

    def _malformed(self, text: str) -> str | None:
        parser = PARSERS.get(self.env_id) if self.entry_point is None else None
        if parser is None:
            return None
        try:
            reason = parser(self.env, text)
        except Exception:  # a parser that changed shape says nothing rather than break the episode
            return None
        return None if reason is None else f"skyrl-gym {self.env_id}: {reason}"

    async def step(self, action: Action) -> StepResult:
        if self.env is None:
            raise RuntimeError("step() before reset()")
        malformed = self._malformed(action.text)
        out = await self._call("step", self.env.step, action.text)
        if not isinstance(out, dict) or "reward" not in out or "done" not in out:
            raise SkyRLGymError(f"skyrl-gym env {self.env_id!r}: step() gave no reward/done: {out!r:.200}")
        metadata = out.get("metadata") or {}
        self.env_metrics = _numbers(metadata)
        if self.env_id in SOLVED_AT and self.entry_point is None:
            self.metrics["success"] = float(float(out["reward"]) >= SOLVED_AT[self.env_id])
        if out.get("postprocessed_action") is not None:  # not applied: the record keeps the sampled tokens
            self.metrics["postprocessed_actions"] = self.metrics.get("postprocessed_actions", 0.0) + 1
        return StepResult(
            observations=[_message(self.env_id, m) for m in out.get("observations") or []],
            reward=float(out["reward"]),
            done=bool(out["done"]),
            info=dict(metadata),
            malformed=malformed,
        )

    async def evaluate(self) -> float | None:
        """Keeps the sum of the step rewards; the env's own metrics go into the record."""
        if self.env is not None:
            self.metrics.update(self.env_metrics)
            self.metrics.update(_numbers(await self._call("get_metrics", self.env.get_metrics)))
        return None

    async def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            await self._call("close", env.close)
