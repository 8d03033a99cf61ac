"""Training an agent program we did not write: each episode runs the user's command against the
policy server in this process, and the session the server recorded becomes the trajectory.

:class:`ExternalAgent` plays the rollout pipeline's three stages as :class:`~horizonrl.agent.loop.Agent`
does, so the same schedulers, failure policy, trainers and evals apply:

- *init*: make the env, reset it on the task, open a session for the episode (bound to the task,
  the env, and the run's sampling parameters and per-turn seeds), write the task file;
- *run*: the command, with the server's URL and the session id in its environment; a nonzero exit
  is ``error`` (with the end of its stderr), a command still running after ``command_timeout_s``
  is killed with its process group (``timeout``);
- *eval*: the reward posted to ``/v1/horizon/sessions/{id}/reward`` if there is one, else the env's
  outcome reward (or the sum of the step rewards the session's ``/step`` calls earned).

The program talks to the server with any OpenAI client; it runs tools through
``POST {HORIZON_BASE_URL}/v1/horizon/sessions/{id}/step`` (the env's tools, on the env the session
holds) or its own way, and then posts a reward.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import secrets
import shlex
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from horizonrl.agent.loop import Episode, checked_messages
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.base import Env
from horizonrl.serve.app import create_app
from horizonrl.serve.server import LiveServer
from horizonrl.serve.service import PolicyService
from horizonrl.types import Trajectory

STDERR_TAIL = 2000


class ExternalAgent:
    """Runs episodes by running ``command`` per episode (see the module doc). Use it inside
    ``async with agent.serving():`` — the policy server is up only there."""

    def __init__(
        self,
        service: PolicyService,
        command: str,
        sampling: SamplingParams,
        workdir: Path,
        *,
        timeout_s: float = 600.0,
        max_turns: int | None = None,
        token_budget: int | None = None,
        port: int = 0,
    ) -> None:
        self.service = service
        self.command = command
        self.sampling = sampling
        self.workdir = Path(workdir)
        self.timeout_s = timeout_s
        self.max_turns = max_turns
        self.token_budget = token_budget
        self.token = secrets.token_hex(16)
        self._app = create_app(service, token=self.token)
        self._port = port
        self.base_url: str | None = None

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        """The policy server, live in this event loop, for the episodes run inside."""
        async with LiveServer(self._app, port=self._port) as url:
            self._port = int(url.rsplit(":", 1)[1])  # the same port for every rollout of a run
            self.base_url = url
            try:
                yield url
            finally:
                self.base_url = None

    # ------------------------------------------------------------------------------ stages
    async def start(self, ep: Episode, make_env: Callable[[], Env]) -> None:
        """Init stage: env reset, the episode's session, the task file."""
        ep.env = make_env()
        ep.env_name = ep.env.name or type(ep.env).__name__
        messages = checked_messages(ep.env, await ep.env.reset(ep.task))
        ep.messages = list(messages)
        sampling = ep.job.sampling or self.sampling
        self.service.sessions.open(
            ep.traj_id,
            task_id=ep.task.id,
            group_id=ep.group_id,
            env=ep.env,
            env_name=ep.env_name,
            initial=messages,
            forced=sampling,
            token_budget=self.token_budget,
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        task_file = self._task_file(ep)
        task_file.write_text(
            json.dumps(
                {
                    "task_id": ep.task.id,
                    "session_id": ep.traj_id,
                    "model": self.service.model_name,
                    "messages": [m.to_dict() for m in messages],
                    "tools": [t.to_openai() for t in ep.env.tools],
                    "max_turns": self.max_turns,
                },
                indent=1,
            ),
            encoding="utf-8",
        )

    async def play(self, ep: Episode) -> None:
        """Run stage: the user's command, until it exits (or is killed at ``timeout_s``)."""
        if self.base_url is None:
            raise RuntimeError("ExternalAgent.play outside `async with agent.serving()`: no server is up")
        task_file = self._task_file(ep)
        quoted = {
            "task_file": shlex.quote(str(task_file)),
            "session_id": shlex.quote(ep.traj_id),
            "base_url": shlex.quote(self.base_url),
            "python": shlex.quote(sys.executable),
        }
        env = {
            **os.environ,
            "OPENAI_BASE_URL": f"{self.base_url}/v1",
            "OPENAI_API_KEY": self.token,
            "HORIZON_BASE_URL": self.base_url,
            "HORIZON_SESSION_ID": ep.traj_id,
            "HORIZON_MODEL": self.service.model_name,
            "HORIZON_TASK_FILE": str(task_file),
        }
        proc = await asyncio.create_subprocess_shell(
            self.command.format(**quoted),
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: killed whole on timeout or cancel
        )
        try:
            async with asyncio.timeout(self.timeout_s):
                _, stderr = await proc.communicate()
        except TimeoutError:
            _kill_group(proc)
            await proc.wait()
            ep.fail(
                "timeout",
                f"the agent command ran longer than agent.command_timeout_s={self.timeout_s}",
                "run",
            )
            return
        except BaseException:
            _kill_group(proc)
            raise
        if proc.returncode != 0:
            tail = stderr.decode("utf-8", errors="replace")[-STDERR_TAIL:]
            raise RuntimeError(f"the agent command exited with status {proc.returncode}:\n{tail}")
        session = self.service.sessions.get(ep.traj_id)
        ep.num_turns = session.num_turns
        ep.finish = "finished" if session.env_done or session.closed else "turn_budget"

    async def score(self, ep: Episode) -> None:
        """Eval stage: the posted reward, else the env's outcome (or its step rewards' sum)."""
        assert ep.env is not None, "score() before start()"
        session = self.service.sessions.get(ep.traj_id)
        if session.reward is not None:
            total: Any = session.reward
        else:
            outcome = await ep.env.evaluate()
            total = outcome if outcome is not None else sum(session.turn_rewards)
        if not isinstance(total, int | float) or not math.isfinite(total):
            raise ValueError(f"non-finite or non-numeric reward ({total!r}) for task {ep.task.id!r}")
        ep.reward = float(total)
        ep.metrics.update(ep.env.metrics)

    async def close(self, ep: Episode, timeout: float | None = 60.0) -> None:
        env, ep.env = ep.env, None
        with contextlib.suppress(FileNotFoundError):
            self._task_file(ep).unlink()
        if env is not None:
            try:
                async with asyncio.timeout(timeout):
                    await env.close()
            except Exception as exc:
                ep.fail("error", f"closing the env failed: {exc!r}", "close")

    def record(self, ep: Episode) -> Trajectory:
        """The episode's trajectory: the session's tokens, the episode's reward and finish."""
        if ep.traj_id not in self.service.sessions:  # init failed before the session opened
            return Trajectory(
                id=ep.traj_id,
                task_id=ep.task.id,
                group_id=ep.group_id,
                env=ep.env_name,
                messages=ep.messages,
                prompt_ids=[],
                finish=ep.finish or "error",
                error=ep.error,
                metrics=ep.metrics,
                timings=ep.timings,
            )
        session = self.service.sessions.take(ep.traj_id)
        chat = self.service.chat_format(_tools_of(session)) if session.tools_key is not None else None
        traj = session.trajectory(
            ep.finish or "error",
            ep.reward if ep.reward is not None and not ep.failed else 0.0,
            error=ep.error,
            metrics=ep.metrics,
            chat=chat,
        )
        traj.timings = ep.timings
        return traj

    def _task_file(self, ep: Episode) -> Path:
        return self.workdir / f"{ep.traj_id.replace('/', '_')}.json"


def _tools_of(session: Any) -> list[Any]:
    from horizonrl.types import ToolSpec

    return [ToolSpec.model_validate_json(t) for t in session.tools_key or ()]


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def episode_agent(config: Any, engine: Any, tokenizer: Any, loop_agent: Any, workdir: Path) -> Any:
    """The agent that plays ``config``'s episodes: ``loop_agent`` (HorizonRL's turn loop), or for
    ``agent.kind: external`` an :class:`ExternalAgent` running ``agent.command`` against a policy
    server on ``engine``."""
    if config.agent.kind != "external":
        return loop_agent
    from horizonrl.serve.service import ServeLimits

    service = PolicyService(
        engine,
        tokenizer,
        config.name,
        ServeLimits(default_max_tokens=config.sampling.max_new_tokens, max_in_flight=1024),
    )
    return ExternalAgent(
        service,
        config.agent.command,
        config.sampling,
        workdir,
        timeout_s=config.agent.command_timeout_s,
        max_turns=config.agent.max_turns,
        token_budget=loop_agent.token_budget,
    )


async def served(agent: Any, work: Any) -> Any:
    """Await ``work`` (a rollout), with ``agent``'s policy server up when it is an external agent."""
    if not isinstance(agent, ExternalAgent):
        return await work
    async with agent.serving():
        return await work
