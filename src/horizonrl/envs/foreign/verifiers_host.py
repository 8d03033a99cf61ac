"""Where verifiers episodes run for :mod:`horizonrl.envs.foreign.verifiers`: verifiers' own
``Env.run_episode`` on a background event loop, with this project's agent loop as the model.

verifiers runs an episode itself: its env's ``run`` (the turns it takes with each agent seat), the
task's ``@stop``s and interceptors, its tool servers, ``setup``/``finalize`` and the ``@reward`` /
``@metric`` scoring, all behind its *interception server*, through which every model call of a seat's
*harness* (the agent program) passes and is recorded on the seat's trace. Two pieces plug this
project in, through verifiers' own extension points:

- :class:`PolicyHarness`, the harness of the seat the policy plays: verifiers' chat loop in process
  (what its ``null`` harness runs as a program): it sends the conversation through the interception
  server, runs the model's tool calls on the task's MCP tool servers (asking the rollout's tool gate
  first), and ends its segment at a reply without tool calls. It is registered as the verifiers
  harness plugin ``horizonrl_policy``;
- :class:`PolicyClient`, the ``vf.Client`` the interception server calls as the seat's model (set
  in the server's client cache for the seat's endpoint config, :data:`POLICY_CLIENT`, which is
  never dialled): each call waits as a :class:`Request` until the agent loop answers with its next
  reply (:meth:`EpisodeRun.reply`).

:class:`Host` owns the background loop (a daemon thread: verifiers' servers outlive any one
``asyncio.run`` of the caller) and one served ``vf.Env`` per env config; an :class:`EpisodeRun` is
one episode, driven from the caller's loop with :meth:`Host.call`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import sys
import threading
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, TypeVar

import httpx
import verifiers.v1 as vf
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.errors import model_error
from verifiers.v1.harnesses.utils.compaction import bound_tool_message
from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp
from verifiers.v1.runtimes import ProgramResult

T = TypeVar("T")

HARNESS_ID = "horizonrl_policy"
#: the endpoint config of the policy's seat: the interception server answers it with PolicyClient
POLICY_CLIENT = vf.EvalClientConfig(
    base_url="http://policy.horizonrl.invalid/v1", api_key_var="HORIZONRL_NONE"
)
MODEL_PREFIX = "horizonrl-episode-"
STOPPED = "the agent loop ended the episode"


class PolicyHarnessConfig(vf.HarnessConfig):
    """The policy's harness takes no settings of its own (``tool_timeout`` is verifiers')."""


class PolicyHarness(vf.Harness[PolicyHarnessConfig]):
    """verifiers' chat loop, in process: the seat's model calls go through the interception
    server (and so onto the trace), its tool calls to the task's MCP servers."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    SUPPORTS_RESUME = True
    SUPPORTS_TOOL_INTERCEPTION = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(  # type: ignore[override]
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        tool_interception_url: str | None = None,
    ) -> ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt:
            messages.extend(message_to_wire(m) for m in prompt)
        auth = {"Authorization": f"Bearer {secret}"}
        async with contextlib.AsyncExitStack() as stack:
            tools: list[dict[str, Any]] = []
            dispatch: dict[str, tuple[str, str]] = {}
            servers: dict[str, Any] = {}
            if mcp_urls:
                config = {
                    "mcpServers": {
                        n: {"url": u, "timeout": self.config.tool_timeout} for n, u in mcp_urls.items()
                    }
                }
                tools, dispatch, servers = await connect_mcp(config, stack)
            client = _http_client()
            while True:
                body: dict[str, Any] = {"model": ctx.model, "messages": messages}
                if tools:
                    body["tools"] = tools
                response = await client.post(
                    f"{endpoint.rstrip('/')}/chat/completions", headers=auth, json=body
                )
                if response.status_code != 200:  # a stop (a limit, a @stop, the agent loop) or a failure
                    code = 0 if trace.stop_condition is not None else 1
                    return ProgramResult(exit_code=code, stdout="", stderr=response.text[-2000:])
                message = response.json()["choices"][0]["message"]
                messages.append({k: v for k, v in message.items() if v is not None})
                if not message.get("tool_calls"):
                    return ProgramResult(exit_code=0, stdout="", stderr="")
                for call in message["tool_calls"]:
                    messages.append(
                        await _run_tool(call, client, tool_interception_url, secret, dispatch, servers)
                    )


async def _run_tool(
    call: dict[str, Any],
    client: httpx.AsyncClient,
    gate: str | None,
    secret: str,
    dispatch: dict[str, tuple[str, str]],
    servers: dict[str, Any],
) -> dict[str, Any]:
    """One tool call as verifiers' chat loop runs it: the rollout's gate first (a denial carries
    the result to show instead), then the MCP server; the result message, bounded."""
    name = call["function"]["name"]
    raw = call["function"].get("arguments") or "{}"
    try:
        arguments: Any = json.loads(raw)
    except json.JSONDecodeError as exc:
        arguments = None
        content: Any = f"error: invalid JSON in tool arguments ({exc}); resend the call with valid JSON"
    if gate:
        decision = await client.post(
            gate,
            headers={"Authorization": f"Bearer {secret}"},
            json={
                "tool_call_id": call["id"],
                "name": name,
                "arguments": raw if arguments is None else arguments,
            },
        )
        decision.raise_for_status()
        verdict = decision.json()
        if verdict["action"] == "stop":
            raise RuntimeError(verdict["reason"])
        if verdict["action"] == "deny":
            return bound_tool_message(verdict["message"])
    if arguments is not None:
        if not isinstance(arguments, dict):
            kind = type(arguments).__name__
            content = f"error: tool arguments must be a JSON object, got {kind}; resend as an object"
        elif name in dispatch:
            content = await call_mcp(servers, dispatch, name, arguments)
        else:
            content = f"error: unknown tool {name!r}"
    return bound_tool_message({"role": "tool", "tool_call_id": call["id"], "content": content, "name": name})


_HTTP: httpx.AsyncClient | None = None


def _http_client() -> httpx.AsyncClient:
    """The harnesses' HTTP client to the interception server, one for the host loop (a client per
    launch costs ~90 ms: it loads the CA bundle)."""
    global _HTTP
    if _HTTP is None:
        _HTTP = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10))
    return _HTTP


def _register_harness() -> None:
    """Make ``horizonrl_policy`` a verifiers harness plugin: verifiers resolves a harness id to
    ``verifiers.v1.harnesses.<id>`` (a module exporting its Harness subclass in ``__all__``)."""
    name = f"verifiers.v1.harnesses.{HARNESS_ID}"
    if name not in sys.modules:
        module = ModuleType(name, "The harness of the seat horizonrl's policy plays.")
        module.__spec__ = ModuleSpec(name, None)
        module.PolicyHarness = PolicyHarness  # type: ignore[attr-defined]
        module.PolicyHarnessConfig = PolicyHarnessConfig  # type: ignore[attr-defined]
        module.__all__ = ["PolicyHarness"]  # type: ignore[attr-defined]
        sys.modules[name] = module


_register_harness()


# ---------------------------------------------------------------- one episode
@dataclass
class Request:
    """A model call of the policy's seat, waiting for the agent loop's reply."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    session: str | None
    answer: asyncio.Future[dict[str, Any] | None]


@dataclass
class Outcome:
    """How the episode ended, as verifiers recorded it."""

    error: str | None = None
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)


class EpisodeRun:
    """One verifiers episode (``env.run_episode``) on the host loop. Its events: the seat's model
    calls (:class:`Request`) and, last, the :class:`Outcome`. Every method runs on the host loop."""

    def __init__(self, host: Host, env: vf.Env, task: vf.Task) -> None:
        self.host, self.env, self.task = host, env, task
        self.key = MODEL_PREFIX + uuid.uuid4().hex
        self.events: asyncio.Queue[Request | Outcome] = asyncio.Queue()
        self.pending: Request | None = None
        self.session: str | None = None  # the trace id of the policy's seat (its first model call)
        self.traces: list[vf.Trace] = []
        self.outcome: Outcome | None = None
        self.runner: asyncio.Task[None] | None = None

    async def start(self) -> Request | Outcome:
        ctx = vf.ModelContext(model=self.key, client=POLICY_CLIENT)
        self.host.episodes[self.key] = self
        self.runner = asyncio.create_task(self._run(ctx))
        return await self._next()

    async def _run(self, ctx: vf.ModelContext) -> None:
        try:
            episode = await self.env.run_episode(self.task, ctx, on_trace=self.traces.append)
            outcome = self._outcome(episode)
        except Exception as exc:  # verifiers records what it can; anything else ends the episode here
            outcome = Outcome(error=f"{type(exc).__name__}: {exc}")
        finally:
            self.host.episodes.pop(self.key, None)
        await self.events.put(outcome)

    def _outcome(self, episode: vf.Episode) -> Outcome:
        mine = [t for t in episode.traces if t.id == self.session] or episode.traces[:1]
        errors = [e for t in mine for e in t.errors] + list(episode.errors)
        if errors:
            return Outcome(error=f"{errors[-1].type}: {errors[-1].message}")
        if not mine:
            return Outcome(error="the episode ran no trace of the policy's seat")
        trace = mine[0]
        metrics = {f"vf_{k}": float(v) for k, v in trace.metrics.items() if isinstance(v, int | float)}
        for name, reward in trace.rewards.items():
            if reward is not None:
                metrics[f"vf_reward_{name}"] = float(reward.score)
        metrics["vf_turns"] = float(trace.num_turns)
        if trace.stop_condition:
            metrics[f"vf_stop:{trace.stop_condition}"] = 1.0
        return Outcome(reward=float(trace.reward), metrics=metrics)

    async def _next(self) -> Request | Outcome:
        event = await self.events.get()
        if isinstance(event, Outcome):
            self.outcome = event
            return event
        if self.session is None:
            self.session = event.session
        elif event.session != self.session:  # the env runs the seat again: a second conversation
            event.answer.set_result(None)
            raise RuntimeError(
                "the verifiers env runs the policy's seat in more than one conversation per episode "
                "(e.g. best-of-n); horizon's agent loop plays one conversation per episode"
            )
        self.pending = event
        return event

    async def reply(self, message: dict[str, Any]) -> Request | Outcome:
        """Answer the pending model call with the agent loop's ``message``; the next event."""
        assert self.pending is not None, "reply() without a pending model call"
        pending, self.pending = self.pending, None
        if not pending.answer.done():
            pending.answer.set_result(message)
        return await self._next()

    async def stop(self, reason: str) -> Outcome:
        """End the exchange early (the agent loop's budget ran out): the seat's trace stops with
        ``reason`` and verifiers finishes the episode as it does at a limit (scoring included)."""
        for trace in self.traces:
            if self.session is None or trace.id == self.session:
                trace.stop(reason)
        while self.outcome is None:
            if self.pending is not None:
                pending, self.pending = self.pending, None
                if not pending.answer.done():
                    pending.answer.set_result(None)
            event = await self.events.get()
            if isinstance(event, Outcome):
                self.outcome = event
            else:
                self.pending = event
        return self.outcome

    async def cancel(self) -> None:
        """Abandon the episode (verifiers releases what it holds); idempotent."""
        if self.pending is not None and not self.pending.answer.done():
            self.pending.answer.set_result(None)
        if self.runner is not None and not self.runner.done():
            self.runner.cancel()
            with contextlib.suppress(BaseException):
                await self.runner
        self.host.episodes.pop(self.key, None)


# ---------------------------------------------------------------- the model and the host
class PolicyClient(vf.Client):
    """The policy's seat's model: a call becomes the episode's next :class:`Request` and is
    answered by the agent loop's reply (an error when the agent loop ended the episode)."""

    def __init__(self, host: Host) -> None:
        self.host = host

    async def get_response(  # type: ignore[override]
        self, dialect: Any, body: dict, sampling: Any, session_id: str | None = None, **_: Any
    ) -> Any:
        episode = self.host.episodes.get(str(body.get("model")))
        if episode is None:
            raise model_error(f"no episode {body.get('model')!r} is running", status_code=404)
        answer: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()
        await episode.events.put(
            Request(body.get("messages") or [], body.get("tools") or [], session_id, answer)
        )
        message = await answer
        if message is None:
            raise model_error(STOPPED, status_code=409)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        raw = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
        response = dialect.parse_response(dialect.validate_response(raw))
        response.raw = raw
        return response


class Host:
    """The background event loop and the served envs (one per process)."""

    _instance: Host | None = None
    _lock = threading.Lock()

    @classmethod
    def get(cls) -> Host:
        with cls._lock:
            if cls._instance is None:
                cls._instance = Host()
            return cls._instance

    def __init__(self) -> None:
        logging.getLogger("verifiers").propagate = False  # its tracebacks go to the trace, not stderr
        self.episodes: dict[str, EpisodeRun] = {}
        self.envs: dict[str, vf.Env] = {}
        self.env_lock = asyncio.Lock()
        self.stack = contextlib.AsyncExitStack()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="horizonrl-verifiers", daemon=True)
        self.thread.start()
        atexit.register(self.shutdown)

    async def call(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` on the host loop and await it from the caller's loop (cancelling the
        caller cancels the work)."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self.loop))

    async def env(self, key: str, make: Callable[[], vf.Env]) -> vf.Env:
        """The served env of config ``key`` (``make`` builds it the first time; its config asks
        for a single interception server, whose client for :data:`POLICY_CLIENT` is set here)."""
        async with self.env_lock:
            if key not in self.envs:
                env = make()
                await self.stack.enter_async_context(env.serving())
                clients = getattr(getattr(env, "_interception", None), "clients", None)
                if not isinstance(clients, dict):
                    raise RuntimeError(
                        f"verifiers {vf.__name__} serves its model calls in a way this adapter does not "
                        "know (it is written for verifiers 0.4's interception server)"
                    )
                clients[POLICY_CLIENT.model_dump_json()] = PolicyClient(self)
                self.envs[key] = env
            return self.envs[key]

    def shutdown(self) -> None:
        """Close the served envs (at exit)."""
        if not self.loop.is_running():
            return

        async def close() -> None:
            for episode in list(self.episodes.values()):
                await episode.cancel()
            await self.stack.aclose()
            if _HTTP is not None:
                await _HTTP.aclose()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
