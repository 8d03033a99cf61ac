"""The CodeAct-style turn loop: the model writes a tool call, the env answers, until done.

An episode passes through three stages, each a method of :class:`Agent` working on an
:class:`Episode`: ``start`` (make the env and reset it: the rollout's *init* stage), ``play`` (the
multi-turn loop, one ``turn`` at a time: the *run* stage) and ``score`` (the env's outcome reward:
the *eval* stage); ``close`` releases the env and ``record`` builds the trajectory. The rollout
pipeline (:mod:`horizonrl.rollout.pipeline`) and the lockstep baseline schedule these stages;
:meth:`Agent.run` chains them for one episode. The episode carries its
:class:`~horizonrl.agent.job.RolloutJob` — the task, its ids, and the scripted policy or the
sampling parameters it is sampled with — so the stages take nothing but the episode.

One :class:`Agent` serves many concurrent episodes (the engine batches their generation requests).
It builds the trajectory record token by token: model tokens with ``loss_mask`` 1 and their sampling
logprobs, template and observation tokens with mask 0. Nothing the model writes can crash the run:
unreadable calls get a corrective observation. An env whose action is the whole reply
(``Env.text_actions``) gets every reply as it is, unparsed, and its own parser says which replies it
could not read (``StepResult.malformed``). Every stage runs under :func:`guarded`, so an env,
engine or reward exception, a malformed env result or a stage timeout ends the episode with
``finish: "error"`` or ``"timeout"`` and the traceback in ``error`` instead of propagating.
"""

from __future__ import annotations

import asyncio
import math
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import ValidationError

from horizonrl.agent.config import AgentConfig, StageTimeouts
from horizonrl.agent.job import RolloutJob
from horizonrl.agent.monitors import RepeatDetector, StreakCounter, action_signature, remaining_budget
from horizonrl.chat import ChatFormat
from horizonrl.engine.base import Engine, SamplingParams
from horizonrl.engine.constraints import Constraint
from horizonrl.envs.base import Env, ScriptedPolicy
from horizonrl.seeds import derive_seed
from horizonrl.tokens import ResponseStream
from horizonrl.toolcalls import malformed_feedback, parse_tool_calls
from horizonrl.toolformats import detect
from horizonrl.types import (
    Action,
    ConstrainedSpan,
    FinishReason,
    Message,
    StepResult,
    Task,
    Timings,
    Trajectory,
    with_system_note,
)

Stage = Literal["init", "run", "eval"]


class Episode(ResponseStream):
    """One episode in flight: its job, its env, the token sequence being built, and how it ended."""

    def __init__(self, job: RolloutJob) -> None:
        self.job = job
        self.env: Env | None = None
        self.env_name = "unknown"
        self.chat: ChatFormat | None = None
        self.prompt_ids: list[int] = []
        self.messages: list[Message] = []
        self.response_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.turn_rewards: list[float] = []
        self.num_turns = 0
        self.metrics: dict[str, float] = {"model_tokens": 0.0, "env_tokens": 0.0, "tool_errors": 0.0}
        self.finish: FinishReason | None = None
        self.error: str | None = None
        self.failed_stage: str | None = None
        self.reward: float | None = None
        self.timings = Timings()
        self.queued_at = 0.0  # when the episode last entered a rollout queue (set by the scheduler)
        self.pending: Action | list[Message] | None = None  # act() -> respond(): action or feedback
        self.repeats: RepeatDetector | None = None
        self.malformed: StreakCounter | None = None
        self.policy_versions: list[int] = []  # the weights version of each sampled turn
        self.constrained: list[ConstrainedSpan] = []  # turns sampled under a constraint
        self.constraints: list[dict[str, Any]] = []  # their distinct constraints

    @property
    def task(self) -> Task:
        return self.job.task

    @property
    def traj_id(self) -> str:
        return self.job.traj_id

    @property
    def group_id(self) -> str:
        return self.job.group_id

    @property
    def policy(self) -> ScriptedPolicy | None:
        """The scripted policy writing this episode's turns (None: the model)."""
        return self.job.policy

    @property
    def done(self) -> bool:
        """The run stage is over (a finish reason is set)."""
        return self.finish is not None

    @property
    def failed(self) -> bool:
        """An infrastructure failure (exception or timeout), not something the model did."""
        return self.finish in ("error", "timeout")

    def fail(self, finish: Literal["error", "timeout"], error: str, stage: str) -> None:
        """Mark an infrastructure failure in ``stage``; the first failure is the one reported."""
        if not self.failed:
            self.finish, self.error, self.failed_stage = finish, error, stage

    def add_model_tokens(
        self, ids: list[int], logprobs: list[float], constraint: dict[str, Any] | None = None
    ) -> None:
        self.append_model(ids, logprobs, constraint)
        self.metrics["model_tokens"] += len(ids)

    def add_env_tokens(self, ids: list[int]) -> None:
        self.append_env(ids)
        self.metrics["env_tokens"] += len(ids)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


async def guarded(ep: Episode, stage: Stage, work: Awaitable[Any], timeout: float | None) -> bool:
    """Run one stage of ``ep`` and add its duration to ``ep.timings``. An exception or the stage's
    timeout marks the episode failed (``error``/``timeout`` with the traceback) instead of
    propagating; cancellation (Ctrl-C) propagates. Returns True when the stage succeeded."""
    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout) as deadline:
            await work
        return True
    except TimeoutError:
        if deadline.expired():
            ep.fail("timeout", f"the {stage} stage exceeded its timeout ({stage}_timeout_s={timeout})", stage)
        else:
            ep.fail("error", f"the {stage} stage failed:\n{traceback.format_exc()}", stage)
        return False
    except Exception:
        ep.fail("error", f"the {stage} stage failed:\n{traceback.format_exc()}", stage)
        return False
    finally:
        elapsed = time.perf_counter() - start
        setattr(ep.timings, f"{stage}_s", getattr(ep.timings, f"{stage}_s") + elapsed)


def _env_label(env: Env) -> str:
    return f"env {env.name or type(env).__name__!r}"


def checked_messages(env: Env, out: Any) -> list[Message]:
    """``env.reset``'s result as messages, or a TypeError that names the env and the problem."""
    if not isinstance(out, list) or not out:
        raise TypeError(
            f"{_env_label(env)}: reset() must return a non-empty list of Message, got {type(out).__name__}"
            + (" (empty)" if isinstance(out, list) else "")
        )
    try:
        return [m if isinstance(m, Message) else Message.model_validate(m) for m in out]
    except ValidationError as exc:
        raise TypeError(f"{_env_label(env)}: reset() returned a malformed message: {exc}") from None


def checked_step(env: Env, out: Any) -> StepResult:
    """``env.step``'s result, or a TypeError/ValueError that names the env and the problem."""
    if not isinstance(out, StepResult):
        raise TypeError(f"{_env_label(env)}: step() must return a StepResult, got {type(out).__name__}")
    if not isinstance(out.reward, int | float) or not math.isfinite(out.reward):
        raise ValueError(f"{_env_label(env)}: step() returned a non-finite reward ({out.reward})")
    return out


class Agent:
    """Runs episodes of a tool env with a model (through an Engine) or a scripted policy."""

    def __init__(
        self,
        tokenizer: Any,
        engine: Engine | None,
        sampling: SamplingParams,
        config: AgentConfig,
        context_length: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.engine = engine
        self.sampling = sampling
        self.config = config
        limit = config.max_total_tokens
        self.token_budget = min(limit, context_length) if context_length else limit
        self._formats: dict[tuple[str, ...], ChatFormat] = {}
        self._constraints: dict[tuple[str, ...], Constraint] = {}

    def chat_format(self, env: Env) -> ChatFormat:
        key = tuple(t.model_dump_json() for t in env.tools)
        if key not in self._formats:
            # the ids the engine stops on are the ids the chat format strips (an engine that does
            # not say leaves the tokenizer's EOS)
            eos = getattr(self.engine, "eos_token_ids", None)
            self._formats[key] = ChatFormat(
                self.tokenizer, env.tools, frozenset(eos) if eos else None, self.tool_format
            )
        return self._formats[key]

    async def run(
        self,
        env: Env,
        task: Task,
        traj_id: str,
        group_id: str,
        policy: ScriptedPolicy | None = None,
        sampling: SamplingParams | None = None,
        timeouts: StageTimeouts | None = None,
    ) -> Trajectory:
        """Run one episode of ``task`` in ``env`` through all stages and return its record (with
        ``policy`` writing the turns instead of the model, or the model sampling with ``sampling``
        instead of the agent's parameters). Never raises for anything the model, the env or the
        engine does; the env is closed in every case."""
        limits = timeouts or StageTimeouts()
        ep = Episode(RolloutJob(task, traj_id, group_id, policy, sampling))
        if await guarded(ep, "init", self.start(ep, lambda: env), limits.init_s) and await guarded(
            ep, "run", self.play(ep), limits.run_s
        ):
            await guarded(ep, "eval", self.score(ep), limits.eval_s)
        await self.close(ep, limits.close_s)
        return self.record(ep)

    # ------------------------------------------------------------------ stages
    async def start(self, ep: Episode, make_env: Callable[[], Env]) -> None:
        """Init stage: make the env, reset it on the task, tokenize the prompt."""
        ep.env = make_env()
        ep.env_name = ep.env.name or type(ep.env).__name__
        messages = with_system_note(checked_messages(ep.env, await ep.env.reset(ep.task)), ep.job.system_note)
        ep.chat = self.chat_format(ep.env)
        ep.prompt_ids = ep.chat.prompt_ids(messages)
        ep.messages = list(messages)
        ep.repeats = RepeatDetector(self.config.loop_window)
        ep.malformed = StreakCounter(self.config.max_malformed)

    async def play(self, ep: Episode) -> None:
        """Run stage: turns until the episode ends (``ep.finish`` set)."""
        while not ep.done:
            await self.turn(ep)

    async def turn(self, ep: Episode) -> None:
        """One turn: :meth:`act` then :meth:`respond`. Sets ``ep.finish`` when the episode ends."""
        await self.act(ep)
        if not ep.done:
            await self.respond(ep)

    async def act(self, ep: Episode) -> None:
        """The model's half of a turn (or the job's scripted policy's): generate, parse, check the
        failure modes; leaves the action (or the malformed-call feedback) pending for
        :meth:`respond`, or sets ``ep.finish``."""
        ep.finish = self._turn_limit(ep) or await self._act(ep)

    async def respond(self, ep: Episode) -> None:
        """The env's half of a turn: step with the pending action and append the observation."""
        ep.finish = await self._respond(ep)

    async def score(self, ep: Episode) -> None:
        """Eval stage: the env's outcome reward (or the sum of its step rewards)."""
        assert ep.env is not None and ep.chat is not None, "score() before start()"
        outcome = await ep.env.evaluate()
        total = outcome if outcome is not None else sum(ep.turn_rewards)
        if not isinstance(total, int | float) or not math.isfinite(total):
            raise ValueError(
                f"{_env_label(ep.env)} returned a non-finite or non-numeric reward ({total!r}) "
                f"for task {ep.task.id!r}"
            )
        ep.reward = float(total)
        ep.metrics.update(ep.env.metrics)  # the env's own numbers, e.g. success or per-test results
        ep.metrics["retokenize_drift"] = float(ep.chat.drift(ep.messages, ep.prompt_ids + ep.response_ids))

    async def close(self, ep: Episode, timeout: float | None = 60.0) -> None:
        """Release the env (once); a failure to close marks the episode failed."""
        env, ep.env = ep.env, None
        if env is not None:
            try:
                async with asyncio.timeout(timeout):
                    await env.close()
            except Exception:
                ep.fail("error", f"closing the env failed:\n{traceback.format_exc()}", "close")

    def record(self, ep: Episode) -> Trajectory:
        """The trajectory record of a finished (or failed) episode (with the weights versions its
        turns were sampled from: ``policy_version_min``/``_max``)."""
        if ep.policy_versions:
            ep.metrics["policy_version_min"] = float(min(ep.policy_versions))
            ep.metrics["policy_version_max"] = float(max(ep.policy_versions))
        return Trajectory(
            id=ep.traj_id,
            task_id=ep.task.id,
            group_id=ep.group_id,
            env=ep.env_name,
            messages=ep.messages,
            prompt_ids=ep.prompt_ids,
            response_ids=ep.response_ids,
            loss_mask=ep.loss_mask,
            logprobs=ep.logprobs,
            reward=ep.reward if ep.reward is not None and not ep.failed else 0.0,
            turn_rewards=[r if math.isfinite(r) else 0.0 for r in ep.turn_rewards],
            num_turns=ep.num_turns,
            finish=ep.finish or "error",
            error=ep.error if ep.finish else "the episode ended before its run stage finished",
            metrics=ep.metrics,
            timings=ep.timings,
            constrained=ep.constrained or None,
            constraints=ep.constraints or None,
        )

    # ------------------------------------------------------------------ one turn
    def _turn_limit(self, ep: Episode) -> FinishReason | None:
        if ep.num_turns >= self.config.max_turns:
            return "turn_budget"
        if remaining_budget(ep.length, self.token_budget) == 0:
            return "context_overflow"
        return None

    async def _act(self, ep: Episode) -> FinishReason | None:
        assert ep.env is not None and ep.chat is not None, "act() before start()"
        assert ep.repeats is not None and ep.malformed is not None
        env, chat = ep.env, ep.chat
        budget = remaining_budget(ep.length, self.token_budget)
        generated, logprobs, cut_by_budget, constraint = await self._generate(chat, ep, budget)
        ep.add_model_tokens(generated, logprobs, constraint)
        ep.num_turns += 1
        text = chat.decode(generated)
        parsed = None if env.text_actions else parse_tool_calls(text, id_prefix=f"call_{ep.num_turns}")
        calls = parsed.calls if parsed is not None else []
        ep.messages.append(Message(role="assistant", content=text, tool_calls=calls or None))
        closing = chat.close_turn_ids(generated)
        if cut_by_budget or ep.length + len(closing) > self.token_budget:
            return "context_overflow"
        ep.add_env_tokens(closing)
        if parsed is None:  # the whole reply is the action: the env's own parser reads it (in step)
            if ep.repeats.is_loop(text):
                return "loop"
            ep.pending = Action(text=text)
            return None
        ep.metrics["format_deviations"] = ep.metrics.get("format_deviations", 0.0) + len(parsed.tolerated)
        if not parsed.ok and not env.accepts_text:
            if ep.malformed.record(bad=True):
                ep.metrics["malformed_turns"] = float(ep.malformed.total)
                return "malformed"
            ep.pending = [
                Message(
                    role="user", content=malformed_feedback(parsed.error or "", env.tools, self.tool_format)
                )
            ]
            return None
        ep.malformed.record(bad=not parsed.ok)
        if parsed.ok and ep.repeats.is_loop(action_signature(parsed.calls)):
            return "loop"
        ep.pending = Action(text=text, tool_calls=parsed.calls)
        return None

    async def _respond(self, ep: Episode) -> FinishReason | None:
        assert ep.env is not None and ep.chat is not None and ep.malformed is not None
        pending, ep.pending = ep.pending, None
        if pending is None:
            raise RuntimeError("respond() without a pending action: call act() first")
        if isinstance(pending, Action):
            result = checked_step(ep.env, await ep.env.step(pending))
            ep.turn_rewards.append(float(result.reward))
            ep.metrics["tool_errors"] += float(result.info.get("tool_errors", 0))
            if ep.env.text_actions:  # the env's parser says whether it could read the reply
                too_many = ep.malformed.record(bad=result.malformed is not None)
                ep.metrics["malformed_turns"] = float(ep.malformed.total)
                if too_many and not result.done:
                    return "malformed"
            if result.done:
                return "finished"
            observations = [self._truncate(m) for m in result.observations]
        else:  # feedback on a malformed call
            ep.turn_rewards.append(0.0)
            observations = pending
        ep.metrics["malformed_turns"] = float(ep.malformed.total)
        obs_ids = ep.chat.observation_ids(observations)
        if ep.length + len(obs_ids) >= self.token_budget:
            return "context_overflow"
        ep.add_env_tokens(obs_ids)
        ep.messages.extend(observations)
        return None

    async def _generate(
        self, chat: ChatFormat, ep: Episode, budget: int
    ) -> tuple[list[int], list[float], bool, dict[str, Any] | None]:
        """One assistant turn, by the job's scripted policy or the model with the job's sampling
        parameters (the agent's when the job has none): (token ids, logprobs, whether the token
        budget cut it short, the record fields of the constraint it was sampled under or None)."""
        if ep.policy is not None:
            act_turn = getattr(ep.policy, "act_turn", None)  # a TurnPolicy awaits its turns
            assert ep.env is not None
            text = (
                await act_turn(ep.traj_id, ep.task, ep.messages, ep.env.tools)
                if act_turn is not None
                else ep.policy.act(ep.task, ep.messages)
            )
            ids = [*chat.encode(text), chat.end_of_turn]
            cut = len(ids) > budget
            ids = ids[:budget]
            return ids, [0.0] * len(ids), cut, None
        if self.engine is None:
            raise RuntimeError("Agent has neither an engine nor a scripted policy")
        sampling = ep.job.sampling or self.sampling
        limited = min(sampling.max_new_tokens, budget)
        update: dict[str, Any] = {}
        if limited != sampling.max_new_tokens:
            update["max_new_tokens"] = limited
        if sampling.seed is not None:
            # one stream per (episode, turn): samples do not depend on what shares the engine's batch
            update["seed"] = derive_seed(sampling.seed, ep.traj_id, ep.num_turns)
        assert ep.env is not None
        constraint = self.constraint(ep.env)
        if constraint is not None:
            update["constraint"] = constraint
        params = sampling.model_copy(update=update) if update else sampling
        completion = await self.engine.generate(ep.prompt_ids + ep.response_ids, params)
        ep.policy_versions.append(completion.weights_version)
        if constraint is not None and completion.token_ids:
            ep.metrics["constrained_turns"] = ep.metrics.get("constrained_turns", 0.0) + 1
            if not completion.constraint_met:
                ep.metrics["constraint_unmet"] = ep.metrics.get("constraint_unmet", 0.0) + 1
        cut = completion.finish_reason == "length" and limited < sampling.max_new_tokens
        return (
            list(completion.token_ids),
            list(completion.logprobs),
            cut,
            constraint.as_record() if constraint is not None else None,
        )

    def constraint(self, env: Env) -> Constraint | None:
        """What ``agent.constrain`` holds a turn in ``env`` to (None: free sampling; also for an env
        without tools, or one whose actions are the model's raw text, unless it declares its replies:
        :meth:`Env.reply_choices`)."""
        if self.config.constrain == "none":
            return None
        if env.text_actions:  # the env's own action language, when it is a fixed set of replies
            choices = env.reply_choices()
            if not choices:
                return None
            key = ("choice", *choices)
            if key not in self._constraints:
                self._constraints[key] = Constraint(choice=choices)
            return self._constraints[key]
        if not env.tools or env.accepts_text:
            return None
        key = tuple(t.model_dump_json() for t in env.tools)
        if key not in self._constraints:
            self._constraints[key] = Constraint(
                tools=tuple(env.tools),
                tool_format=self.tool_format,
                allow_text=self.config.constrain == "tools_or_text",
            )
        return self._constraints[key]

    @property
    def tool_format(self) -> str:
        """The tool-call format of constrained turns (``agent.tool_format``; see its description)."""
        if self.config.tool_format != "auto":
            return self.config.tool_format
        return detect(self.tokenizer.chat_template or "") or "hermes"

    def _truncate(self, message: Message) -> Message:
        limit = self.config.max_observation_chars
        if len(message.content) <= limit:
            return message
        head = message.content[: limit // 2]
        tail = message.content[-limit // 2 :]
        omitted = len(message.content) - len(head) - len(tail)
        note = f"\n[... {omitted} characters omitted ...]\n"
        return message.model_copy(update={"content": head + note + tail})
