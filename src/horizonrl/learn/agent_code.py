"""The ``agent_code`` component: a small agent module that decides each turn, run in a sandbox.

A candidate's ``agent.py`` defines ``act(turn) -> dict``. ``turn`` holds ``messages`` (the
conversation so far, as role/content dicts), ``tools`` (the env's tool specs), ``replies`` (the
model's replies to this turn's asks so far) and ``memory`` (what the code kept from earlier turns
of the episode). It answers ``{"ask": messages}`` to consult the model, or ``{"action": text}`` to
take the turn (see :mod:`horizonrl.learn.agent_host`). So the code can rewrite what the model sees,
repair or check its replies, retry, or act without the model at all.

Each call is one process in a bubblewrap sandbox (no network, nothing of the host but the
interpreter) with a timeout: code that raises, loops or answers garbage ends its episode with
``finish: "error"`` and reward 0, and never harms the run.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from horizonrl.chat import ChatFormat
from horizonrl.engine.base import SamplingParams
from horizonrl.learn import agent_host
from horizonrl.sandbox.pyexec import PythonSandbox
from horizonrl.seeds import derive_seed
from horizonrl.types import Message, Task, ToolSpec

DEFAULT_AGENT_CODE = '''\
"""The baseline agent: ask the model with the conversation as it is, and act on its reply."""


def act(turn):
    if not turn["replies"]:
        return {"ask": turn["messages"]}
    return {"action": turn["replies"][-1]}
'''


def check_agent_code(code: str) -> str | None:
    """Why ``code`` cannot be an agent module (it does not parse, or defines no ``act(turn)``), or
    None when it can."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return f"does not parse: {exc.msg} (line {exc.lineno})"
    acts = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "act" and len(n.args.args) == 1
    ]
    if not acts:
        return "defines no top-level act(turn)"
    return None


class AgentCodePolicy:
    """Plays turns with an agent module in a sandbox, answering its asks with ``engine``."""

    def __init__(
        self,
        code: str,
        engine: Any,
        tokenizer: Any,
        sampling: SamplingParams,
        timeout_s: float = 5.0,
        max_asks: int = 3,
        label: str = "agent-code",
    ) -> None:
        problem = check_agent_code(code)
        if problem is not None:
            raise ValueError(f"agent code {problem}")
        self.engine = engine
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.timeout_s = timeout_s
        self.max_asks = max_asks
        files: dict[str, Path | str] = {"agent.py": code, "agent_host.py": Path(agent_host.__file__)}
        self.sandbox = PythonSandbox(label, files, memory_mib=256)
        self._memory: dict[str, dict[str, Any]] = {}
        self._formats: dict[str, ChatFormat] = {}

    def act(self, task: Task, messages: list[Message]) -> str:  # the ScriptedPolicy signature
        raise RuntimeError("AgentCodePolicy plays through act_turn (it awaits the sandbox and the model)")

    def _format(self, tools: list[ToolSpec]) -> ChatFormat:
        key = "".join(t.model_dump_json() for t in tools)
        if key not in self._formats:
            eos = getattr(self.engine, "eos_token_ids", None)
            self._formats[key] = ChatFormat(self.tokenizer, tools, frozenset(eos) if eos else None)
        return self._formats[key]

    async def _ask(self, chat: ChatFormat, asked: list[dict[str, Any]], *stream: object) -> str:
        ids = chat.prompt_ids([Message(role=m["role"], content=m["content"]) for m in asked])
        context = int(getattr(self.engine, "max_context", 0) or 0)
        limit = self.sampling.max_new_tokens
        if context and len(ids) + limit > context:
            raise ValueError(f"agent code asked with {len(ids)} tokens; the model's context is {context}")
        params = self.sampling
        if params.seed is not None:  # one stream per (episode, turn, ask), as the agent loop does per turn
            params = params.model_copy(update={"seed": derive_seed(params.seed, *stream)})
        completion = await self.engine.generate(ids, params)
        return chat.decode(list(completion.token_ids))

    async def act_turn(
        self, episode_id: str, task: Task, messages: list[Message], tools: list[ToolSpec]
    ) -> str:
        """One assistant turn: call the code, answer its asks (at most ``max_asks``), return its action."""
        chat = self._format(tools)
        turn = {
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "tools": [t.model_dump() for t in tools],
            "replies": [],
            "memory": self._memory.get(episode_id, {}),
        }
        for _ in range(self.max_asks + 1):
            answer = await self.sandbox.call("agent_host", {"op": "act", "turn": turn}, self.timeout_s)
            turn["memory"] = answer.get("memory", turn["memory"])
            if "action" in answer:
                self._memory[episode_id] = turn["memory"]
                return answer["action"]
            if len(turn["replies"]) >= self.max_asks:
                break
            asks = len(turn["replies"])
            turn["replies"].append(await self._ask(chat, answer["ask"], episode_id, len(messages), asks))
        raise ValueError(f"agent code asked the model more than {self.max_asks} times in one turn")

    async def aclose(self) -> None:
        await self.sandbox.aclose()
