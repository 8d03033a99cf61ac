"""The agent loop's settings: an episode's budgets, failure detection, constrained turns and the
wall-clock limits of its stages (the recipe's ``agent:`` block and the rollout's timeouts)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class AgentConfig(BaseModel):
    """Budgets and failure detection for one episode."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(
        8, ge=1, le=10_000, description="Turn budget: episodes without finish end as 'turn_budget'."
    )
    max_total_tokens: int = Field(
        4096,
        ge=64,
        le=1_048_576,
        description="Token budget for prompt + response (capped at the model's context); "
        "exceeding it ends the episode as 'context_overflow'.",
    )
    loop_window: int = Field(
        3, ge=2, description="The same action this many turns in a row ends the episode as 'loop'."
    )
    max_malformed: int = Field(
        3,
        ge=1,
        description="This many turns in a row without a readable tool call (for an env whose action is "
        "the whole reply: replies its own parser cannot read) end the episode as 'malformed'.",
    )
    constrain: Literal["none", "tool_calls", "tools_or_text"] = Field(
        "none",
        description="Constrained decoding of the policy's turns: 'tool_calls' holds every turn to one "
        "well-formed call of the env's own tools (names and argument schemas, in tool_format); "
        "'tools_or_text' allows prose (no '<') instead of, or before, the call; 'none' samples freely. "
        "A text-action env that declares its replies (a gymnasium Discrete space's action names) is held to "
        "exactly one of them by either value. The record marks constrained turns, and the trainer computes "
        "their logprobs under the same masks.",
    )
    tool_format: Literal["auto", "hermes", "llama3_json", "mistral"] = Field(
        "auto",
        description="The tool-call format constrained turns are held to: 'auto' reads it off the chat "
        "template, and a template without tool support (SmolLM2's) gets 'hermes', the format the system "
        "prompt then teaches.",
    )
    max_observation_chars: int = Field(
        4000, ge=100, description="Longer observations are truncated, with a note, before tokenization."
    )
    kind: Literal["loop", "external"] = Field(
        "loop",
        description="'loop': HorizonRL's own turn loop. 'external': a program of yours (agent.command) "
        "plays each episode through the OpenAI-compatible policy server, which records its tokens.",
    )
    command: str | None = Field(
        None,
        description="The external agent's command line, run by the shell once per episode, e.g. "
        "'{python} my_agent.py --task {task_file}'. Placeholders: {python} (this interpreter), "
        "{task_file} (JSON: the task's messages and tools), {session_id}, {base_url}; the same go to "
        "its environment as HORIZON_TASK_FILE, HORIZON_SESSION_ID, OPENAI_BASE_URL (with "
        "OPENAI_API_KEY and HORIZON_MODEL).",
    )
    command_timeout_s: float = Field(
        600.0, gt=0, description="An external agent still running after this long is killed ('timeout')."
    )

    @model_validator(mode="after")
    def _check_external(self) -> AgentConfig:
        if self.kind == "external":
            if not self.command or not self.command.strip():
                raise ValueError(
                    "agent.kind external needs agent.command, e.g. 'python my_agent.py --task {task_file}'"
                )
            try:
                self.command.format(task_file="f", session_id="s", base_url="u", python="p")
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(
                    f"agent.command {self.command!r} has a bad placeholder ({exc}); valid: {{python}}, "
                    "{task_file}, {session_id}, {base_url} (write {{ and }} for literal braces)"
                ) from None
        return self


class StageTimeouts(BaseModel):
    """Wall-clock limits per stage of an episode; exceeding one ends it as 'timeout'."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    init_s: float | None = Field(None, gt=0, description="Env creation and reset (None: no limit).")
    run_s: float | None = Field(None, gt=0, description="The whole multi-turn loop (None: no limit).")
    eval_s: float | None = Field(None, gt=0, description="The outcome reward (None: no limit).")
    close_s: float = Field(60.0, gt=0, description="Releasing the env.")
