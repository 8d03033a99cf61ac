"""TextArena's games, run as they are: ``env.name: textarena:<game id>`` (``GuessTheNumber-v0``,
``TicTacToe-v0``, ``Nim-v0``, ... any id TextArena registers, with its variants).

A TextArena game is text in, text out: ``make(id)`` (with the game's default wrappers),
``reset(num_players, seed)``, then while not done ``get_observation()`` gives the player to move and
what it sees, ``step(action)`` plays that player's move (the game's own code parses it), and
``close()`` gives every player's reward. The adapter is a text-action env (``Env.text_actions``):

- the policy plays one seat (the task's ``player``); every other seat is played by the opponent
  (``env.options.opponent``: ``random`` — a random move among the bracketed moves its observation
  shows, checked on a copy of the game by the game's own rules — ``first`` (the first such move), or
  ``module:function`` of your own, called with the seat's observation text, answering the move);
- ``reset`` = ``make`` (a game without an observation wrapper gets TextArena's
  ``LLMObservationWrapper``) + ``reset`` + the opponents' moves before the policy's first turn; its message
  is the policy's observation. ``step`` plays the policy's reply, then the opponents until it is the
  policy's turn again or the game is over; its observation is what the policy's observation gained
  (so the conversation reads as TextArena's own observation text);
- the reward is the policy's reward from ``close()`` at the step that ends the game (0 before); a
  move the game calls invalid (its ``set_invalid_move``) is ``StepResult.malformed``;
- what the game raises ends the episode ``error`` whose last line names the game and the foreign
  exception. Games run on the event loop, each with its own stream of Python's global ``random``
  (TextArena seeds that one), so concurrent episodes stay reproducible. Nothing is downloaded: a game
  that needs NLTK data not on this machine is one line saying what to supply.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import importlib
import io
import random
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from pydantic import Field

from horizonrl.envs.base import Env, EnvOptions
from horizonrl.envs.foreign import offline, reached
from horizonrl.errors import ConfigError, HorizonError, UnknownEnvError
from horizonrl.seeds import derive_seed
from horizonrl.types import Action, Message, StepResult, Task

EXTRA = "textarena"
IMPORT = "textarena"
PREFIX = "textarena"
MAX_PLAYERS = 8  # the most seats tried when finding how many a game takes
_MOVE = re.compile(r"\[[^\[\]\n]{1,40}\]")


class TextArenaError(RuntimeError):
    """A TextArena game (or the opponent) raised; the message names the game and the exception."""


class TextArenaOptions(EnvOptions):
    """Options of a TextArena game (``env.options``)."""

    opponent: str = Field(
        "random",
        description="Who plays the other seats: random (a random bracketed move from the seat's "
        "observation that the game accepts), first (the first such move), or module:function "
        "(called with the seat's observation text, returns its move).",
    )
    player: int | None = Field(
        None, ge=0, description="The seat the policy plays (None: seat i % num_players for the i-th task)."
    )
    num_players: int | None = Field(
        None, ge=1, description="Seats in the game (None: the fewest the game takes)."
    )
    env_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for textarena.make (the game's own settings)."
    )


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _why(exc: BaseException) -> str:
    return _one_line(f"{type(exc).__name__}: {exc}")


def _registry() -> dict[str, Any]:
    from textarena.envs.registration import ENV_REGISTRY

    return ENV_REGISTRY


def env_ids() -> list[str]:
    """Every game id TextArena registers (with its variants: ``-raw``, ``-train``, sizes)."""
    return sorted(_registry())


def _near(env_id: str) -> list[str]:
    """Game ids like ``env_id``: those holding its name (default versions first), else difflib's."""
    stem = env_id.split("-v")[0].strip().lower()
    ids = sorted(_registry(), key=lambda i: (not i.endswith("-v0"), len(i), i))
    holding = [i for i in ids if stem and stem in i.lower()]
    return (holding or difflib.get_close_matches(env_id, ids, n=3))[:4]


def env_class(env_id: str) -> type[Env]:
    """The adapter class bound to TextArena's game ``env_id``."""
    if env_id not in _registry():
        near = _near(env_id)
        hint = f" (did you mean {', '.join(f'{PREFIX}:{i}' for i in near)}?)" if near else ""
        raise UnknownEnvError(
            f"unknown textarena game {env_id!r}{hint}; valid: the {len(_registry())} ids TextArena "
            "registers, each <game>-v0 or a variant of it (-raw, -train, sizes), as `horizon envs` lists "
            f"them: {PREFIX}:GuessTheNumber-v0, {PREFIX}:TicTacToe-v0, {PREFIX}:Nim-v0, ..."
        )
    return type(f"TextArena[{env_id}]", (TextArenaEnv,), {"name": f"{PREFIX}:{env_id}", "game_id": env_id})


# ---------------------------------------------------------------- the other seats
Opponent = Callable[[str], str]


def load_opponent(spec: str) -> Opponent | None:
    """The opponent ``module:function`` names (a class is instantiated without arguments, as a
    TextArena ``Agent`` is); None for the built-in ``random``/``first``. ConfigError in one line."""
    if spec in ("random", "first"):
        return None
    module_name, sep, attr = spec.partition(":")
    valid = "give random, first, or module:function (called with the observation text, returns the move)"
    if not sep or not module_name or not attr:
        raise ConfigError(f"env.options.opponent: {spec!r} is not an opponent; {valid}")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
        if isinstance(obj, type):
            obj = obj()
    except Exception as exc:
        raise ConfigError(f"env.options.opponent: cannot load {spec!r} ({_why(exc)}); {valid}") from None
    if not callable(obj):
        raise ConfigError(f"env.options.opponent: {spec!r} is a {type(obj).__name__}, not callable; {valid}")
    return obj


def _moves(observation: str) -> list[str]:
    """The distinct bracketed moves an observation shows, the latest mention first (role tags such
    as ``[GAME]`` and ``[Player 0]`` are no moves)."""
    seen: list[str] = []
    for move in reversed(_MOVE.findall(observation)):
        if move not in seen and move != "[GAME]" and not re.fullmatch(r"\[Player \d+\]", move):
            seen.append(move)
    return seen


@contextlib.contextmanager
def _invalid_moves(env: Any) -> Iterator[list[str]]:
    """The reasons the game's own ``set_invalid_move`` gives while the block runs."""
    reasons: list[str] = []
    state = getattr(env, "state", None)
    original = getattr(state, "set_invalid_move", None)
    if original is None:
        yield reasons
        return

    def recording(*args: Any, **kwargs: Any) -> Any:
        reasons.append(_one_line(kwargs.get("reason", args[0] if args else "")))
        return original(*args, **kwargs)

    state.set_invalid_move = recording
    try:
        yield reasons
    finally:
        del state.set_invalid_move  # the class's own method again


def _legal(env: Any, move: str) -> bool:
    """Whether the game accepts ``move`` now (tried on a copy; the global random stream is kept)."""
    saved = random.getstate()
    try:
        trial = copy.deepcopy(env)
        with _invalid_moves(trial) as reasons:
            trial.step(move)
        return not reasons
    except Exception:
        return False
    finally:
        random.setstate(saved)


def builtin_move(kind: str, env: Any, observation: str, rng: random.Random) -> str:
    """The ``random``/``first`` opponent's move: a bracketed move the game accepts (its first
    candidate when it accepts none, and the game's rules then judge it)."""
    candidates = _moves(observation)
    if kind == "random":
        rng.shuffle(candidates)
    for move in candidates:
        if _legal(env, move):
            return move
    return candidates[0] if candidates else "[]"


# ---------------------------------------------------------------- the env
def _wrapped(game: Any, kind: type) -> bool:
    while game is not None:
        if isinstance(game, kind):
            return True
        game = getattr(game, "__dict__", {}).get("env")
    return False


@contextlib.contextmanager
def _no_nltk_download() -> Iterator[None]:
    """``nltk.download`` answers False while the block runs (games call it when they are imported):
    nothing is downloaded, and what the game then misses is a LookupError naming the data."""
    nltk = sys.modules.get("nltk")
    if nltk is None:
        yield
        return
    original = nltk.download
    nltk.download = lambda *args, **kwargs: False
    try:
        yield
    finally:
        nltk.download = original


def _nltk_resource(exc: BaseException) -> str | None:
    match = re.search(r"Resource '?([\w./-]+?)'? not found", str(exc))
    return match.group(1) if match else None


_SEATS: dict[tuple[str, int | None, str], int] = {}


class TextArenaEnv(Env[TextArenaOptions]):
    """One game of TextArena (the subclass made by :func:`env_class` says which)."""

    Options = TextArenaOptions
    text_actions = True
    game_id: ClassVar[str] = ""

    def __init__(self, options: TextArenaOptions | None = None) -> None:
        super().__init__(options)
        self.game: Any = None
        self.player = 0
        self.seen = ""  # the policy's observation text so far
        self.pending = ""  # its observation text now
        self.opponent = load_opponent(self.options.opponent)
        self.rng = random.Random(0)
        self.random_state: Any = None  # this game's stream of the global random

    # ------------------------------------------------------------ tasks
    @classmethod
    def make_tasks(cls, split: str, n: int, seed: int, options: TextArenaOptions) -> list[Task]:
        """``n`` games: a seed each (train and test seeds differ), and the seat the policy plays;
        the game is made once here, so a game that cannot start is one line before any model loads."""
        load_opponent(options.opponent)
        seats = cls.seats(options)
        if options.player is not None and options.player >= seats:
            raise ConfigError(
                f"env.options.player: {options.player} is no seat of {cls.name!r}, which has {seats} "
                f"(valid: 0-{seats - 1})"
            )
        tasks = []
        for i in range(n):
            player = options.player if options.player is not None else i % seats
            data = {"seed": derive_seed(cls.game_id, split, seed, i) % 2**31, "player": player}
            tasks.append(Task(id=f"{cls.game_id}-{split}-{seed}-{i}", env=cls.name, split=split, data=data))
        return tasks

    @classmethod
    def seats(cls, options: TextArenaOptions) -> int:
        """How many players the game is reset with: ``num_players``, else the fewest it takes."""
        key = (cls.game_id, options.num_players, repr(sorted(options.env_kwargs.items())))
        if key in _SEATS:
            return _SEATS[key]
        tries = [options.num_players] if options.num_players is not None else list(range(1, MAX_PLAYERS + 1))
        saved, why = random.getstate(), ""
        try:
            for count in tries:
                game = cls.make_game(options)
                try:
                    game.reset(num_players=count, seed=0)
                except AssertionError as exc:  # TextArena's states assert their number of players
                    why = _one_line(exc)
                    continue
                except Exception as exc:
                    raise HorizonError(f"textarena game {cls.game_id!r} cannot start: {_why(exc)}") from None
                _SEATS[key] = count
                return count
        finally:
            random.setstate(saved)
        raise ConfigError(
            f"env.options.num_players: textarena game {cls.game_id!r} cannot be played by "
            f"{tries[0] if len(tries) == 1 else f'1-{MAX_PLAYERS}'} players ({why})"
        )

    @classmethod
    def make_game(cls, options: TextArenaOptions) -> Any:
        """``textarena.make(id, **env_kwargs)``, offline and quiet; a game that needs data not on this
        machine (NLTK corpora) is one line naming it."""
        import textarena

        out = io.StringIO()
        try:
            with (
                offline(),
                _no_nltk_download(),
                contextlib.redirect_stdout(out),
                contextlib.redirect_stderr(out),
            ):
                game = textarena.make(cls.game_id, **options.env_kwargs)
            if not _wrapped(game, textarena.ObservationWrapper):  # observations as text, TextArena's way
                game = textarena.wrappers.LLMObservationWrapper(game)
            return game
        except LookupError as exc:
            resource = _nltk_resource(exc)
            if resource is None:
                raise
            raise HorizonError(
                f"textarena game {cls.game_id!r} needs NLTK's {resource!r} data, and nothing is downloaded "
                f"at run time: supply it with `python -m nltk.downloader {resource}` (or put it in a folder "
                "named by NLTK_DATA)"
            ) from None
        except (OSError, TypeError) as exc:
            host = reached()
            if host is not None:
                raise HorizonError(
                    f"textarena game {cls.game_id!r} loads data from the network (it asked for {host}), and "
                    "nothing is downloaded at run time; supply the data it needs on this machine"
                ) from None
            if isinstance(exc, TypeError):
                raise HorizonError(
                    f"env.options.env_kwargs: textarena game {cls.game_id!r} does not take them: "
                    f"{_one_line(exc)}"
                ) from None
            raise

    # ------------------------------------------------------------ playing
    @contextlib.contextmanager
    def _own_random(self) -> Iterator[None]:
        """This game's stream of the global ``random`` while the block runs."""
        outer = random.getstate()
        if self.random_state is not None:
            random.setstate(self.random_state)
        try:
            yield
        finally:
            self.random_state = random.getstate()
            random.setstate(outer)

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            with self._own_random():
                return fn(*args)
        except HorizonError:
            raise
        except Exception as exc:
            raise TextArenaError(f"textarena game {self.game_id!r} raised in {what}: {_why(exc)}") from exc

    def _opponents(self) -> bool:
        """Play the other seats until it is the policy's turn or the game is over; True: over."""
        done = False
        while not done:
            seat, observation = self._call("get_observation", self.game.get_observation)
            if seat == self.player:
                self.pending = observation
                return False
            move = self._opponent_move(seat, observation)
            done, _ = self._call("step", self.game.step, move)
        return True

    def _opponent_move(self, seat: int, observation: str) -> str:
        if self.opponent is None:
            with self._own_random():
                return builtin_move(self.options.opponent, self.game, observation, self.rng)
        try:
            move = self.opponent(observation)
        except Exception as exc:
            raise TextArenaError(
                f"the opponent {self.options.opponent!r} (seat {seat}) raised: {_why(exc)}"
            ) from exc
        if not isinstance(move, str):
            raise TextArenaError(
                f"the opponent {self.options.opponent!r} returned a {type(move).__name__}, not a move"
            )
        return move

    def _observe(self) -> str:
        """What the policy's observation gained since its last turn (all of it when it does not
        extend the last one, as with wrappers that show only the latest board)."""
        text = self.pending
        new = text[len(self.seen) :] if text.startswith(self.seen) else text
        self.seen = text
        return new

    async def reset(self, task: Task) -> list[Message]:
        self.metrics = {"invalid_moves": 0.0}
        seed = int(task.data.get("seed", 0))
        self.player = int(task.data.get("player", 0))
        self.rng = random.Random(derive_seed("opponent", seed))
        self.random_state, self.seen, self.pending = None, "", ""
        seats = self.seats(self.options)
        if self.player >= seats:
            raise TextArenaError(
                f"textarena game {self.game_id!r} has {seats} seats; the task's player is {self.player}"
            )
        self.game = self.make_game(self.options)
        self._call("reset", self.game.reset, seats, seed)
        if self._opponents():
            raise TextArenaError(f"textarena game {self.game_id!r} ended before the policy's first move")
        return [Message(role="user", content=self._observe())]

    async def step(self, action: Action) -> StepResult:
        if self.game is None:
            raise RuntimeError("step() before reset()")
        with _invalid_moves(self.game) as reasons:
            done, info = self._call("step", self.game.step, action.text)
        malformed = f"textarena {self.game_id}: {reasons[0]}" if reasons else None
        self.metrics["invalid_moves"] += float(bool(reasons))
        if not done:
            done = self._opponents()
        reward = 0.0
        if done:
            rewards, game_info = self._call("close", self.game.close)
            reward = float((rewards or {}).get(self.player, 0.0))
            mine = (game_info or {}).get(self.player, {}) if isinstance(game_info, dict) else {}
            self.metrics.update({k: float(v) for k, v in mine.items() if isinstance(v, int | float)})
            self.metrics["success"] = float(reward >= 1.0)
            self.game = None
            observations = []
        else:
            new = self._observe()
            observations = [Message(role="user", content=new)] if new else []
        return StepResult(
            observations=observations,
            reward=reward,
            done=bool(done),
            info=dict(info or {}),
            malformed=malformed,
        )

    async def close(self) -> None:
        self.game = None  # TextArena's close() is the scoring call: nothing else to release
