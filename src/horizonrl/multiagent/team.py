"""Running a chat chain (:mod:`horizonrl.multiagent.chain`) on a task: a team of roles working in one
env's workspace, each role sampling from its own policy, every role's turns a trajectory of that role.

The env is the workspace: the chain's roles call its tools (``write_file``, ``run_python``,
``run_examples`` in the humaneval env) in its sandbox, later phases read the files earlier ones wrote,
and the env's outcome reward (the hidden tests on the final solution) is the team's reward, given to
every role's trajectories. An env a chain runs on offers :class:`Workspace` besides its tools.

One **turn** of a role is one or more steps: a step that calls tools gets their results (as tool
messages in the role's own view) and the role steps again, up to ``max_tool_rounds`` calls; the text
of its last step is what the other role reads. A call the phase does not give the role, or a write to
a file the phase does not write, is refused with an error the role reads (and the trace shows). A
reply without tool calls from a role that may write the solution, whose ```python block defines a
function, is written to the solution file (ChatDev's programmer answers that way).

A role's trajectory covers one phase run (``<episode>/<phase>[.<cycle>]/<role>``): its system
prompt, the phase's opening context, its own steps (loss mask 1), the other role's messages and the
tool results (mask 0). The :class:`ChainEpisodeRecord` holds the turn order and the chain's state
(:class:`~horizonrl.multiagent.chain_record.ChainFacts`) that failure analysis reads.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from horizonrl.chat import ChatFormat
from horizonrl.engine.base import Completion, SamplingParams
from horizonrl.envs.base import Env
from horizonrl.envs.humaneval.problems import code_block
from horizonrl.errors import ConfigError
from horizonrl.multiagent.chain import ChainLoop, ChainPhase, ChatChain
from horizonrl.multiagent.chain_record import ChainCheck, ChainFacts, ChainPhaseRun, PhaseEnd
from horizonrl.multiagent.episode import Policies, RoleView, role_trajectory, step_params
from horizonrl.multiagent.graph import RoleSpec
from horizonrl.toolcalls import parse_tool_calls
from horizonrl.types import Action, Message, Task, ToolCall, Trajectory

MIN_STEP_TOKENS = 16
"""A role whose context has fewer tokens left than this ends its phase (``context_full``)."""


class TeamScript(Protocol):
    """A scripted team (an oracle): the text of a role's next step, from what the role has seen."""

    def act(self, role: str, phase: ChainPhase, task: Task, messages: list[Message]) -> str: ...


@runtime_checkable
class Workspace(Protocol):
    """What an env offers a chain besides its tools: its workspace's files."""

    async def read_workspace(self, path: str) -> str: ...


class ChainEpisodeRecord(BaseModel):
    """One chain episode (one line of ``episodes.jsonl``)."""

    episode_id: str
    graph: str = Field(description="The chain's name.")
    task_id: str
    order: list[str] = Field(description="The role of each step, in the order taken.")
    adapters: dict[str, str | None]
    chain: ChainFacts
    reward: float
    success: bool
    generated_tokens: int
    error: str | None = None


@dataclass
class EpisodeState:
    """What one episode has done so far."""

    order: list[str] = field(default_factory=list)
    phases: list[ChainPhaseRun] = field(default_factory=list)
    checks: list[ChainCheck] = field(default_factory=list)
    last_messages: dict[str, str] = field(default_factory=dict)
    views: list[tuple[str, RoleView]] = field(default_factory=list)  # (phase run id, view)


class TeamRunner:
    """Runs ``chain`` on tasks: each role's policy from ``policies``, its tools from ``make_env()``."""

    def __init__(
        self,
        chain: ChatChain,
        policies: Policies,
        tokenizer: Any,
        eos_ids: frozenset[int] | None,
        sampling: SamplingParams,
        make_env: Any,
        env_name: str,
        max_total_tokens: int,
        script: TeamScript | None = None,
    ) -> None:
        """``script``: a scripted team writing every step instead of the policies (demonstrations)."""
        self.chain, self.policies, self.sampling, self.script = chain, policies, sampling, script
        self.make_env, self.env_name, self.max_total_tokens = make_env, env_name, max_total_tokens
        self.tokenizer, self.eos_ids = tokenizer, eos_ids
        self._formats: dict[tuple[str, ...], ChatFormat] = {}
        probe = make_env()
        if not isinstance(probe, Workspace):
            raise ConfigError(
                f"env {env_name!r} has no workspace a chain can read (read_workspace); chat chains run on "
                "envs whose tools write and run files in a sandbox, e.g. humaneval"
            )
        self.tool_specs = {t.name: t for t in probe.tools}
        chain.check_tools(set(self.tool_specs), env_name)

    def _chat(self, tools: tuple[str, ...]) -> ChatFormat:
        if tools not in self._formats:
            specs = [self.tool_specs[t] for t in tools]
            self._formats[tools] = ChatFormat(self.tokenizer, specs, self.eos_ids)
        return self._formats[tools]

    # -- one phase -------------------------------------------------------------------------------
    async def _context(
        self, env: Any, task: Task, phase: ChainPhase, state: EpisodeState, report: str
    ) -> str:
        parts = [f"Task:\n```python\n{str(task.data.get('prompt', '')).strip()}\n```"]
        if phase.prompt:
            parts.append(f"Phase '{phase.name}': {phase.prompt}")
        for seen in phase.sees:
            if seen in state.last_messages:
                parts.append(f"From the {seen} phase:\n{state.last_messages[seen]}")
        for path in phase.reads:
            parts.append(f"{path} now:\n```python\n{(await env.read_workspace(path)).rstrip()}\n```")
        if phase.test_report and report:
            parts.append(f"Test report (the docstring's examples):\n{report}")
        return "\n\n".join(parts)

    def _view(self, phase: ChainPhase, role: str, context: str) -> RoleView:
        spec = self.chain.roles[role]
        other = phase.assistant if role == phase.instructor else phase.instructor
        part = "instruct" if role == phase.instructor else "answer"
        system = (
            f"{spec.system}\nIn this phase you {part} the {other}. When the phase's work is done, write "
            f"{self.chain.consensus}."
        )
        messages = [Message(role="system", content=system), Message(role="user", content=context)]
        view_role = RoleSpec(
            name=role, system=system, adapter=spec.adapter, max_new_tokens=spec.max_new_tokens
        )
        return RoleView(view_role, self._chat(phase.tools.get(role, ())), messages)

    async def _call(self, env: Env, phase: ChainPhase, role: str, call: ToolCall) -> Message:
        allowed = phase.tools.get(role, ())
        if call.name not in allowed:
            refusal = (
                f"Error: role {role!r} may not call {call.name} in phase {phase.name!r} "
                f"(it may call: {', '.join(allowed) or 'nothing'})."
            )
            return Message(role="tool", content=refusal, tool_call_id=call.id, name=call.name)
        path = call.arguments.get("path", self.chain.solution)
        if call.name == "write_file" and str(path) not in phase.writes:
            refusal = (
                f"Error: phase {phase.name!r} writes only {', '.join(phase.writes) or 'no files'}; "
                f"{path!r} is not one of them."
            )
            return Message(role="tool", content=refusal, tool_call_id=call.id, name=call.name)
        result = await env.step(Action(text="", tool_calls=[call]))
        return result.observations[0]

    async def _turn(
        self, env: Env, task: Task, phase: ChainPhase, view: RoleView, state: EpisodeState, *seed: object
    ) -> tuple[str, bool, bool]:
        """One turn of the view's role: (the text the other role reads, consensus, context full)."""
        role = view.role.name
        text = ""
        for round_ in range(self.chain.max_tool_rounds + 1):
            room = self.max_total_tokens - len(view.sequence)
            if room < MIN_STEP_TOKENS:
                return text, False, True
            params = step_params(
                min(view.role.max_new_tokens, room), self.sampling, None, *seed, role, view.turns
            )
            start = time.perf_counter()
            if self.script is not None:  # a scripted step: its text as the role's tokens
                said = self.script.act(role, phase, task, view.messages)
                ids = [*view.chat.encode(said), view.chat.end_of_turn][:room]  # not cut at the role budget
                completion = Completion(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")
            else:
                completion = await self.policies(self.chain.roles[role].adapter).generate(
                    view.sequence, params
                )
            view.generate_s += time.perf_counter() - start
            text = view.add_own(completion)
            state.order.append(role)
            calls = parse_tool_calls(text, id_prefix=f"call_{len(state.order)}").calls
            if calls:
                view.messages[-1] = view.messages[-1].model_copy(update={"tool_calls": calls})
            if self.chain.consensus in text:
                return text, True, False
            if not calls:
                code = code_block(text)
                may_write = "write_file" in phase.tools.get(role, ()) and self.chain.solution in phase.writes
                if code is not None and may_write:
                    write = ToolCall(
                        id=f"block_{len(state.order)}", name="write_file", arguments={"content": code}
                    )
                    await env.step(Action(text="", tool_calls=[write]))
                return text, False, False
            view.add_messages([await self._call(env, phase, role, call) for call in calls])
            if round_ == self.chain.max_tool_rounds:
                break
        return text, False, False

    async def _phase(
        self,
        env: Any,
        task: Task,
        phase: ChainPhase,
        cycle: int,
        state: EpisodeState,
        report: str,
        *seed: object,
    ) -> None:
        context = await self._context(env, task, phase, state, report)
        views = [self._view(phase, role, context) for role in phase.roles]
        run_id = phase.name if cycle == 0 else f"{phase.name}.{cycle}"
        first = len(state.order)
        ended: PhaseEnd = "turn_cap"
        by: str | None = None
        speaker = 0
        assert phase.max_turns is not None  # the chain refuses a dialogue without a cap
        for _ in range(phase.max_turns):
            text, consensus, full = await self._turn(env, task, phase, views[speaker], state, *seed, run_id)
            if full:
                ended = "context_full"
                break
            state.last_messages[phase.name] = text
            if consensus:
                ended, by = "consensus", phase.roles[speaker]
                break
            speaker = 1 - speaker
            views[speaker].add_other(text)
        last = len(state.order) - 1
        state.phases.append(
            ChainPhaseRun(
                name=phase.name,
                cycle=cycle,
                roles=list(phase.roles),
                first_step=first if last >= first else -1,
                last_step=last if last >= first else -1,
                ended=ended,
                consensus_by=by,
            )
        )
        state.views += [(run_id, v) for v in views if v.turns]

    async def _check(self, env: Env, where: str, state: EpisodeState) -> ChainCheck:
        assert self.chain.check is not None
        result = await env.step(Action(text="", tool_calls=[ToolCall(id="check", name=self.chain.check)]))
        passed = result.info.get("passed")
        check = ChainCheck(
            after_step=len(state.order) - 1,
            phase=where,
            passed=bool(passed),
            output=result.observations[0].content if result.observations else "",
        )
        state.checks.append(check)
        return check

    # -- one episode -----------------------------------------------------------------------------
    async def run(
        self, task: Task, episode_id: str | None = None, *seed: object
    ) -> tuple[ChainEpisodeRecord, list[Trajectory]]:
        """One whole episode of the chain on ``task``; an env or engine failure ends it with reward 0
        and the error recorded."""
        episode_id = episode_id or f"ep-{uuid.uuid4().hex[:12]}"
        env: Any = self.make_env()
        state = EpisodeState()
        reward, error = 0.0, None
        try:
            await env.reset(task)
            for item in self.chain.phases:
                if isinstance(item, ChainLoop):
                    await self._loop(env, task, item, state, episode_id, *seed)
                else:
                    await self._phase(env, task, item, 0, state, "", episode_id, *seed)
            if self.chain.check is not None:
                await self._check(env, "final", state)
            outcome = await env.evaluate()
            reward = float(outcome or 0.0)
            final_code = await env.read_workspace(self.chain.solution)
        except Exception as exc:  # an env or engine failure ends this episode, not the eval
            error = f"{type(exc).__name__}: {exc}"
            final_code = ""
        finally:
            await env.close()
        facts = ChainFacts(
            chain=self.chain.name,
            entry_point=str(task.data.get("entry_point", "")),
            permissions=self.chain.permissions(),
            phases=state.phases,
            checks=state.checks,
            final_code=final_code,
        )
        record = ChainEpisodeRecord(
            episode_id=episode_id,
            graph=self.chain.name,
            task_id=task.id,
            order=state.order,
            adapters={name: r.adapter for name, r in self.chain.roles.items()},
            chain=facts,
            reward=reward,
            success=reward >= 1.0,
            generated_tokens=sum(sum(v.loss_mask) for _, v in state.views),
            error=error,
        )
        trajs = [
            role_trajectory(
                v,
                task,
                self.env_name,
                f"{episode_id}/{run_id}/{v.role.name}",
                episode_id,
                reward,
                record.success,
            )
            for run_id, v in state.views
        ]
        return record, trajs

    async def _loop(self, env: Env, task: Task, loop: ChainLoop, state: EpisodeState, *seed: object) -> None:
        assert loop.max_cycles is not None  # the chain refuses a loop without a cap
        for cycle in range(1, loop.max_cycles + 1):
            check = await self._check(env, loop.loop, state)
            if check.passed:
                return
            for phase in loop.phases:
                await self._phase(env, task, phase, cycle, state, check.output, *seed)


def configured_team(
    config: Any,
    chain: ChatChain,
    tokenizer: Any,
    sampling: SamplingParams,
    engine: Any = None,
    script: TeamScript | None = None,
) -> TeamRunner:
    """The team of ``chain`` in the workspaces of ``config.env``: every role sampling from
    ``engine`` (its own adapter's view when the chain names one), or ``script`` playing every role."""
    from horizonrl.envs.factory import env_factory

    eos = getattr(engine, "eos_token_ids", None)
    return TeamRunner(
        chain,
        lambda adapter: engine if adapter is None else engine.view(adapter),
        tokenizer,
        frozenset(eos) if eos else None,
        sampling,
        env_factory(config.env),
        config.env.name,
        config.agent.max_total_tokens,
        script,
    )
