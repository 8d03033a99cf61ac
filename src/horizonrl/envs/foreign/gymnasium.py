"""Gymnasium's text envs, run as they are: ``env.name: gymnasium:<id>`` for an env whose
observations are text (``gymnasium.spaces.Text``, or ``str`` observations) and whose action space is
``Text`` or ``Discrete``; ``gymnasium:<module>:<id>`` imports ``module`` first (where the env
registers itself), as ``gymnasium.make`` does, and ``gymnasium:<path/to/file.py>:<id>`` imports that
file.

The mapping (a text-action env, ``Env.text_actions``: the agent loop hands over every reply):

- a task is a seed (``make_tasks``; train and test seeds differ) or a line of ``env.tasks_file``
  with ``data.seed`` (and ``data.options``, passed to ``reset``); the env is made once per episode
  with ``gymnasium.make(id, **env.options.make_kwargs)``;
- ``reset(seed=, options=)`` -> an optional system message saying what a reply must be, and the
  observation as the user message; ``step(action)`` -> the observation (a user message), the reward,
  ``done = terminated or truncated``, ``info`` as ``StepResult.info``;
- the reply is the action: for ``Text``, the reply without its surrounding whitespace; for
  ``Discrete(n, start)``, an integer or an action name (the env's ``get_action_meanings()`` or
  ``metadata["action_names"]``, case-insensitive). The action space's own ``contains`` decides:
  a reply that is no action is ``StepResult.malformed`` and is not stepped (the model is told the
  valid actions, and the episode goes on);
- what the env raises ends the episode ``error`` whose last line names the env and the exception.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from horizonrl.envs.base import Env, EnvOptions
from horizonrl.envs.foreign import import_file
from horizonrl.errors import UnknownEnvError
from horizonrl.seeds import derive_seed
from horizonrl.types import Action, Message, StepResult, Task

EXTRA = "gymnasium"
IMPORT = "gymnasium"
PREFIX = "gymnasium"
#: spaces whose values are never text (an env observing one of these does not run here)
NUMERIC_SPACES = ("Box", "Discrete", "MultiDiscrete", "MultiBinary", "Dict", "Tuple", "Graph", "Sequence")


class GymnasiumError(RuntimeError):
    """A gymnasium env raised or answered out of contract; the message names the env."""


class GymnasiumOptions(EnvOptions):
    """Options of a gymnasium env (``env.options``)."""

    make_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for gymnasium.make (the env's own settings)."
    )
    reset_options: dict[str, Any] = Field(
        default_factory=dict, description="options= for every reset (a task's data.options is added)."
    )
    system_prompt: str | None = Field(
        None, description="The system message (None: one saying what a reply must be; '': none)."
    )
    in_thread: bool = Field(False, description="Run reset/step in a worker thread (for slow envs).")


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _gym() -> Any:
    import gymnasium

    return gymnasium


def env_ids() -> list[str]:
    """The registered ids whose envs come from outside gymnasium (gymnasium's own envs observe
    numbers, never text); any ``module:id`` works as well."""
    return sorted(env_id for env_id, spec in _gym().registry.items() if not _own(spec.entry_point))


def _own(entry_point: Any) -> bool:
    """Whether an entry point is gymnasium's own (a ``module:Class`` string or a callable)."""
    module = entry_point if isinstance(entry_point, str) else getattr(entry_point, "__module__", "")
    return str(module).split(".")[0] == "gymnasium"


def _split(env_id: str) -> tuple[str | None, str]:
    module, sep, name = env_id.rpartition(":")
    return (module, name) if sep else (None, env_id)


def env_class(env_id: str) -> type[Env]:
    """The adapter class bound to gymnasium's env ``env_id``; the env is made once here to check its
    spaces (UnknownEnvError in one line for an unknown id or an env that is not text in, text out)."""
    module, name = _split(env_id)
    if module is not None:
        try:
            if module.endswith(".py"):  # a file: imported once under a name of its own
                import_file(Path(module), f"horizonrl_gymnasium_{Path(module).stem}")
            else:
                importlib.import_module(module)
        except Exception as exc:
            raise UnknownEnvError(
                f"env '{PREFIX}:{env_id}': module {module!r} does not import "
                f"({_one_line(f'{type(exc).__name__}: {exc}')}); give a registered id, module:<id> or "
                "path/to/file.py:<id>"
            ) from None
    if name not in _gym().registry:
        text_ids = ", ".join(f"{PREFIX}:{i}" for i in env_ids()) or "none registered"
        raise UnknownEnvError(
            f"unknown gymnasium env {env_id!r}; valid: {text_ids} (or {PREFIX}:<module>:<id> of an env "
            "that module registers; gymnasium's own envs observe numbers, not text)"
        )
    try:
        probe = _gym().make(name)
    except Exception as exc:
        raise UnknownEnvError(
            f"gymnasium env {env_id!r} cannot be made: {_one_line(f'{type(exc).__name__}: {exc}')}"
        ) from None
    try:
        _check_spaces(env_id, probe)
    finally:
        probe.close()
    attrs = {"name": f"{PREFIX}:{env_id}", "env_id": name}
    return type(f"Gymnasium[{env_id}]", (GymnasiumEnv,), attrs)


def _check_spaces(env_id: str, env: Any) -> None:
    spaces = _gym().spaces
    observed, acted = env.observation_space, env.action_space
    if type(observed).__name__ in NUMERIC_SPACES and not isinstance(observed, spaces.Text):
        raise UnknownEnvError(
            f"gymnasium env {env_id!r} observes {observed}, not text: only envs whose observation space is "
            "gymnasium.spaces.Text (or whose observations are str) run here"
        )
    if not isinstance(acted, spaces.Text | spaces.Discrete):
        raise UnknownEnvError(
            f"gymnasium env {env_id!r} acts in {acted}: only Text and Discrete action spaces map onto a reply"
        )


# ---------------------------------------------------------------- replies as actions
def action_names(env: Any) -> list[str]:
    """The names of a Discrete env's actions, by index from ``start`` (empty when it names none)."""
    unwrapped = getattr(env, "unwrapped", env)
    meanings = getattr(unwrapped, "get_action_meanings", None)
    try:
        names = (
            meanings()
            if callable(meanings)
            else (getattr(unwrapped, "metadata", {}) or {}).get("action_names")
        )
    except Exception:
        names = None
    return [str(n) for n in names] if isinstance(names, list | tuple) else []


def valid_actions(env: Any) -> str:
    """What a reply may be, in words (the system message and the malformed feedback say it)."""
    space = env.action_space
    if isinstance(space, _gym().spaces.Text):
        return (
            f"the action text itself, {space.min_length}-{space.max_length} characters from the env's "
            "character set"
        )
    start, names = int(space.start), action_names(env)
    listed = [f"{start + i} ({names[i]})" if i < len(names) else str(start + i) for i in range(int(space.n))]
    return "exactly one action: " + ", ".join(listed) + (" or its name" if names else "")


def parse_action(env: Any, reply: str) -> tuple[Any, str | None]:
    """The action a reply names, or (None, why) when the action space does not contain it."""
    space, text = env.action_space, reply.strip()
    if isinstance(space, _gym().spaces.Text):
        return (text, None) if space.contains(text) else (None, "not in the Text action space")
    names = [n.lower() for n in action_names(env)]
    if text.lower() in names:
        action: Any = int(space.start) + names.index(text.lower())
    else:
        try:
            action = int(text)
        except ValueError:
            return None, f"{text[:40]!r} is no action index" + (" or name" if names else "")
    value = space.dtype.type(action)
    return (value, None) if space.contains(value) else (None, f"{action} is not in {space}")


# ---------------------------------------------------------------- the env
class GymnasiumEnv(Env[GymnasiumOptions]):
    """One episode of a gymnasium text env (the subclass made by :func:`env_class` says which)."""

    Options = GymnasiumOptions
    text_actions = True
    env_id: ClassVar[str] = ""

    def __init__(self, options: GymnasiumOptions | None = None) -> None:
        super().__init__(options)
        self.env: Any = None

    @classmethod
    def make_tasks(cls, split: str, n: int, seed: int, options: GymnasiumOptions) -> list[Task]:
        """``n`` episodes, a reset seed each (train and test seeds differ)."""
        return [
            Task(
                id=f"{cls.env_id}-{split}-{seed}-{i}",
                env=cls.name,
                split=split,
                data={"seed": derive_seed(cls.env_id, split, seed, i) % 2**31},
            )
            for i in range(n)
        ]

    async def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            if self.options.in_thread:
                return await asyncio.to_thread(fn, *args, **kwargs)
            return fn(*args, **kwargs)
        except Exception as exc:
            raise GymnasiumError(
                f"gymnasium env {self.env_id!r} raised in {what}: {_one_line(f'{type(exc).__name__}: {exc}')}"
            ) from exc

    def _text(self, observation: Any) -> str:
        if not isinstance(observation, str):
            raise GymnasiumError(
                f"gymnasium env {self.env_id!r} gave a {type(observation).__name__} observation; only text "
                "(str) observations map onto chat"
            )
        return observation

    async def reset(self, task: Task) -> list[Message]:
        await self.close()
        self.metrics = {}
        self.env = await self._call("make", _gym().make, self.env_id, **self.options.make_kwargs)
        options = {**self.options.reset_options, **(task.data.get("options") or {})}
        seed = task.data.get("seed")
        observation, _ = await self._call("reset", self.env.reset, seed=seed, options=options or None)
        system = self.options.system_prompt
        if system is None:
            system = f"Reply with {valid_actions(self.env)}; nothing else."
        first = [Message(role="system", content=system)] if system else []
        return [*first, Message(role="user", content=self._text(observation))]

    def reply_choices(self) -> tuple[str, ...] | None:
        """A ``Discrete`` space's actions by name (by number when it names none); None for ``Text``."""
        if self.env is None or not isinstance(self.env.action_space, _gym().spaces.Discrete):
            return None
        space = self.env.action_space
        names = action_names(self.env)
        if len(names) == int(space.n) and len(set(names)) == len(names) and all(names):
            return tuple(names)
        return tuple(str(int(space.start) + i) for i in range(int(space.n)))

    async def step(self, action: Action) -> StepResult:
        if self.env is None:
            raise RuntimeError("step() before reset()")
        value, why = parse_action(self.env, action.text)
        if why is not None:
            self.metrics["invalid_actions"] = self.metrics.get("invalid_actions", 0.0) + 1
            feedback = f"Invalid action: {why}. Reply with {valid_actions(self.env)}."
            return StepResult(
                observations=[Message(role="user", content=feedback)],
                malformed=f"gymnasium {self.env_id}: {why}",
            )
        observation, reward, terminated, truncated, info = await self._call("step", self.env.step, value)
        done = bool(terminated or truncated)
        self.metrics.update(terminated=float(bool(terminated)), truncated=float(bool(truncated)))
        info = dict(info or {})
        for key in ("is_success", "success"):
            if isinstance(info.get(key), bool | int | float):
                self.metrics["success"] = float(info[key])
        return StepResult(
            observations=[Message(role="user", content=self._text(observation))],
            reward=float(reward),
            done=done,
            info=info,
        )

    async def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            await self._call("close", env.close)
