"""The CodeAct-style turn loop: the model writes a tool call, the env answers, until done.

One :class:`Agent` runs one episode at a time per call and can serve many concurrent episodes (the
engine batches their generation requests). It builds the trajectory record token by token: model
tokens with ``loss_mask`` 1 and their sampling logprobs, template and observation tokens with mask 0.
Nothing the model writes can crash the run: unreadable calls get a corrective observation, env and
engine exceptions end the episode with ``finish: "error"`` and the traceback in ``error``.
"""

from __future__ import annotations

import asyncio
import math
import time
import traceback
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from horizonrl.agent.chat import ChatFormat
from horizonrl.agent.monitors import RepeatDetector, StreakCounter, action_signature, remaining_budget
from horizonrl.agent.parsing import malformed_feedback, parse_tool_calls
from horizonrl.engine.base import Engine, SamplingParams
from horizonrl.envs.base import Env, ScriptedPolicy
from horizonrl.types import Action, FinishReason, Message, Task, Timings, Trajectory


class AgentConfig(BaseModel):
    """Budgets and failure detection for one episode."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(8, ge=1, description="Turn budget: episodes without finish end as 'turn_budget'.")
    max_total_tokens: int = Field(
        4096,
        ge=64,
        description="Token budget for prompt + response (capped at the model's context); "
        "exceeding it ends the episode as 'context_overflow'.",
    )
    loop_window: int = Field(
        3, ge=2, description="The same action this many turns in a row ends the episode as 'loop'."
    )
    max_malformed: int = Field(
        3,
        ge=1,
        description="This many turns in a row without a readable tool call end the episode as 'malformed'.",
    )
    max_observation_chars: int = Field(
        4000, ge=100, description="Longer observations are truncated, with a note, before tokenization."
    )
    episode_timeout_s: float | None = Field(
        None, gt=0, description="Wall-clock limit per episode; exceeding it ends the episode as 'timeout'."
    )


class _Episode:
    """Mutable state of one episode: the token sequence being built and its bookkeeping."""

    def __init__(self, prompt_ids: list[int], messages: list[Message]) -> None:
        self.prompt_ids = prompt_ids
        self.messages = messages
        self.response_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.turn_rewards: list[float] = []
        self.num_turns = 0
        self.metrics: dict[str, float] = {"model_tokens": 0.0, "env_tokens": 0.0, "tool_errors": 0.0}

    def add_model_tokens(self, ids: list[int], logprobs: list[float]) -> None:
        self.response_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += logprobs
        self.metrics["model_tokens"] += len(ids)

    def add_env_tokens(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.metrics["env_tokens"] += len(ids)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


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

    def chat_format(self, env: Env) -> ChatFormat:
        key = tuple(t.model_dump_json() for t in env.tools)
        if key not in self._formats:
            self._formats[key] = ChatFormat(self.tokenizer, env.tools)
        return self._formats[key]

    async def run(
        self,
        env: Env,
        task: Task,
        traj_id: str,
        group_id: str,
        policy: ScriptedPolicy | None = None,
        sampling: SamplingParams | None = None,
    ) -> Trajectory:
        """Run one episode of ``task`` in ``env`` and return its trajectory record. Never raises for
        anything the model, the env or the engine does; the env is closed in every case."""
        timings = Timings()
        episode: _Episode | None = None
        finish: FinishReason = "error"
        error: str | None = None
        reward: float | None = None
        start = time.perf_counter()
        try:
            messages = await env.reset(task)
            chat = self.chat_format(env)
            episode = _Episode(chat.prompt_ids(messages), list(messages))
            timings.init_s = time.perf_counter() - start
            run_start = time.perf_counter()
            coro = self._turns(env, task, chat, episode, policy, sampling or self.sampling)
            if self.config.episode_timeout_s is not None:
                finish = await asyncio.wait_for(coro, self.config.episode_timeout_s)
            else:
                finish = await coro
            eval_start = time.perf_counter()
            timings.run_s = eval_start - run_start
            outcome = await env.evaluate()
            timings.eval_s = time.perf_counter() - eval_start
            total = outcome if outcome is not None else sum(episode.turn_rewards)
            if not math.isfinite(total):
                raise ValueError(f"the env returned a non-finite reward ({total}) for task {task.id!r}")
            reward = total
            episode.metrics["retokenize_drift"] = float(
                chat.drift(episode.messages, episode.prompt_ids + episode.response_ids)
            )
        except TimeoutError:
            finish, error = "timeout", f"episode exceeded episode_timeout_s={self.config.episode_timeout_s}"
        except Exception:
            finish, error = "error", traceback.format_exc()
        finally:
            try:
                await env.close()
            except Exception:
                if error is None:
                    finish, error = "error", traceback.format_exc()
        if error is not None and episode is not None and timings.run_s == 0.0:
            timings.run_s = time.perf_counter() - start - timings.init_s
        return self._record(task, env, traj_id, group_id, episode, finish, error, reward, timings)

    async def _turns(
        self,
        env: Env,
        task: Task,
        chat: ChatFormat,
        ep: _Episode,
        policy: ScriptedPolicy | None,
        sampling: SamplingParams,
    ) -> FinishReason:
        cfg = self.config
        repeats = RepeatDetector(cfg.loop_window)
        malformed = StreakCounter(cfg.max_malformed)
        while True:
            if ep.num_turns >= cfg.max_turns:
                return "turn_budget"
            budget = remaining_budget(ep.length, self.token_budget)
            if budget == 0:
                return "context_overflow"
            generated, logprobs, cut_by_budget = await self._generate(
                chat, task, ep, policy, sampling, budget
            )
            ep.add_model_tokens(generated, logprobs)
            ep.num_turns += 1
            text = chat.decode(generated)
            parsed = parse_tool_calls(text, id_prefix=f"call_{ep.num_turns}")
            ep.messages.append(Message(role="assistant", content=text, tool_calls=parsed.calls or None))
            closing = chat.close_turn_ids(generated)
            if cut_by_budget or ep.length + len(closing) > self.token_budget:
                return "context_overflow"
            ep.add_env_tokens(closing)
            ep.metrics["format_deviations"] = ep.metrics.get("format_deviations", 0.0) + len(parsed.tolerated)

            if not parsed.ok:
                if malformed.record(bad=True):
                    ep.metrics["malformed_turns"] = float(malformed.total)
                    return "malformed"
                observations = [
                    Message(role="user", content=malformed_feedback(parsed.error or "", env.tools))
                ]
                ep.turn_rewards.append(0.0)
            else:
                malformed.record(bad=False)
                if repeats.is_loop(action_signature(parsed.calls)):
                    return "loop"
                result = await env.step(Action(text=text, tool_calls=parsed.calls))
                ep.turn_rewards.append(float(result.reward))
                ep.metrics["tool_errors"] += float(result.info.get("tool_errors", 0))
                if result.done:
                    return "finished"
                observations = [self._truncate(m) for m in result.observations]
            ep.metrics["malformed_turns"] = float(malformed.total)
            obs_ids = chat.observation_ids(observations)
            if ep.length + len(obs_ids) >= self.token_budget:
                return "context_overflow"
            ep.add_env_tokens(obs_ids)
            ep.messages.extend(observations)

    async def _generate(
        self,
        chat: ChatFormat,
        task: Task,
        ep: _Episode,
        policy: ScriptedPolicy | None,
        sampling: SamplingParams,
        budget: int,
    ) -> tuple[list[int], list[float], bool]:
        """One assistant turn: (token ids, logprobs, whether the token budget cut it short)."""
        if policy is not None:
            ids = chat.encode(policy.act(task, ep.messages)) + sorted(chat.eos_ids)[:1]
            cut = len(ids) > budget
            ids = ids[:budget]
            return ids, [0.0] * len(ids), cut
        if self.engine is None:
            raise RuntimeError("Agent has neither an engine nor a scripted policy")
        limited = min(sampling.max_new_tokens, budget)
        params = (
            sampling.model_copy(update={"max_new_tokens": limited})
            if limited != sampling.max_new_tokens
            else sampling
        )
        completion = await self.engine.generate(ep.prompt_ids + ep.response_ids, params)
        cut = completion.finish_reason == "length" and limited < sampling.max_new_tokens
        return list(completion.token_ids), list(completion.logprobs), cut

    def _truncate(self, message: Message) -> Message:
        limit = self.config.max_observation_chars
        if len(message.content) <= limit:
            return message
        head = message.content[: limit // 2]
        tail = message.content[-limit // 2 :]
        omitted = len(message.content) - len(head) - len(tail)
        note = f"\n[... {omitted} characters omitted ...]\n"
        return message.model_copy(update={"content": head + note + tail})

    def _record(
        self,
        task: Task,
        env: Env,
        traj_id: str,
        group_id: str,
        ep: _Episode | None,
        finish: FinishReason,
        error: str | None,
        reward: float | None,
        timings: Timings,
    ) -> Trajectory:
        if ep is None:  # reset failed: an empty record that still says what happened
            ep = _Episode([], [])
        return Trajectory(
            id=traj_id,
            task_id=task.id,
            group_id=group_id,
            env=env.name or type(env).__name__,
            messages=ep.messages,
            prompt_ids=ep.prompt_ids,
            response_ids=ep.response_ids,
            loss_mask=ep.loss_mask,
            logprobs=ep.logprobs,
            reward=float(reward) if reward is not None else 0.0,
            turn_rewards=[r if math.isfinite(r) else 0.0 for r in ep.turn_rewards],
            num_turns=ep.num_turns,
            finish=finish,
            error=error,
            metrics=ep.metrics,
            timings=timings,
        )
