"""Chat rendering and tokenization for multi-turn agents, without re-tokenizing earlier turns.

The running token sequence is built incrementally: the initial prompt is rendered once with the
tokenizer's chat template; the model's own tokens are appended as sampled; then only the *new*
tokens are appended — the template's end-of-turn suffix after an assistant message and the tokens of
the environment's observations plus the next generation prompt. Those deltas are computed once per
observation against a small fixed reference conversation ("template diff"), so the trained tokens are
exactly the sampled tokens. Where a template cannot be split this way the difference is detected
(:meth:`ChatFormat.drift`) and counted in the trajectory's metrics.

Templates without tool support (SmolLM2's ChatML, for one) get the tools and the call format in the
system prompt, and tool results as ``<tool_response>`` blocks in a user turn, as Qwen/Hermes render
them.
"""

from __future__ import annotations

from typing import Any

from horizonrl.tokens import end_of_turn_id, eos_token_ids
from horizonrl.toolcalls import format_instructions
from horizonrl.types import Message, ToolSpec

_REF_SYSTEM = "S"
_REF_USER = "U"
_REF_ASSISTANT = "A"


class TemplateError(RuntimeError):
    """The chat template does not render incrementally (its output for a conversation is not a
    prefix of its output for that conversation extended)."""


class ChatFormat:
    """Renders conversations for one tokenizer and tool set, and yields token deltas."""

    def __init__(
        self,
        tokenizer: Any,
        tools: list[ToolSpec],
        eos_ids: frozenset[int] | None = None,
        tool_format: str = "hermes",
    ) -> None:
        """``eos_ids``: the ids that end a turn (the engine's, :func:`horizonrl.tokens.eos_token_ids`;
        default the tokenizer's EOS). ``tool_format``: the call format the system prompt teaches
        where the template has no tool support (:mod:`horizonrl.toolformats`)."""
        self.tool_format = tool_format
        self.tokenizer = tokenizer
        self.tools = tools
        template = tokenizer.chat_template or ""
        if not template:
            raise TemplateError("the tokenizer has no chat template; use an instruction-tuned model")
        self.native_tools = "tools" in template and "tool_call" in template
        self.eos_ids = eos_ids if eos_ids is not None else eos_token_ids(tokenizer)
        #: the id a scripted turn or a training pair's turn ends with
        self.end_of_turn = end_of_turn_id(tokenizer, self.eos_ids)
        self._suffix_ids = self._assistant_suffix_ids()

    # -- rendering ---------------------------------------------------------------------------------
    def _template_messages(self, messages: list[Message]) -> list[dict[str, Any]]:
        """Messages as the template should see them (tools folded into the system prompt and tool
        results into user turns when the template has no tool support)."""
        out: list[dict[str, Any]] = []
        for msg in messages:
            if msg.role == "assistant":
                out.append({"role": "assistant", "content": msg.content})
            elif msg.role == "tool" and not self.native_tools:
                block = f"<tool_response>\n{msg.content}\n</tool_response>"
                if out and out[-1].get("_tool_group"):
                    out[-1]["content"] += "\n" + block
                else:
                    out.append({"role": "user", "content": block, "_tool_group": True})
            elif msg.role == "system" and not self.native_tools and self.tools:
                out.append(
                    {
                        "role": "system",
                        "content": f"{msg.content}\n\n{format_instructions(self.tools, self.tool_format)}",
                    }
                )
            else:
                out.append(msg.to_dict())
        for item in out:
            item.pop("_tool_group", None)
        return out

    def render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        """The conversation as text, exactly as the chat template writes it."""
        kwargs: dict[str, Any] = {}
        if self.native_tools and self.tools:
            kwargs["tools"] = [t.to_openai() for t in self.tools]
        return self.tokenizer.apply_chat_template(
            self._template_messages(messages),
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        """The text of model tokens, without a trailing end-of-sequence token."""
        while ids and ids[-1] in self.eos_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    # -- token deltas ------------------------------------------------------------------------------
    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """Tokens of the initial messages followed by the assistant generation prompt."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def _ref(self) -> list[Message]:
        return [
            Message(role="system", content=_REF_SYSTEM),
            Message(role="user", content=_REF_USER),
            Message(role="assistant", content=_REF_ASSISTANT),
        ]

    def _assistant_suffix_ids(self) -> list[int]:
        """Tokens the template writes after an assistant message's content (e.g. ``<|im_end|>\\n``)."""
        ref = self._ref()
        head = self.render(ref[:2], add_generation_prompt=True) + _REF_ASSISTANT
        full = self.render(ref, add_generation_prompt=False)
        if not full.startswith(head):
            raise TemplateError(
                "the chat template does not render an assistant turn after its generation prompt"
            )
        return self.encode(full[len(head) :])

    def close_turn_ids(self, generated: list[int]) -> list[int]:
        """Template tokens that end the assistant turn after ``generated`` (the part of the suffix the
        model did not write itself: e.g. the newline after ``<|im_end|>``, or the whole suffix when the
        turn was cut off by the token limit)."""
        suffix = self._suffix_ids
        if generated and suffix and generated[-1] == suffix[0]:
            return suffix[1:]
        return suffix

    def observation_ids(self, observations: list[Message]) -> list[int]:
        """Tokens that append ``observations`` after a closed assistant turn and open the next one."""
        ref = self._ref()
        before = self.render(ref, add_generation_prompt=False)
        after = self.render(ref + observations, add_generation_prompt=True)
        if not after.startswith(before):
            raise TemplateError("the chat template re-renders earlier turns when a message is appended")
        return self.encode(after[len(before) :])

    def drift(self, messages: list[Message], sequence: list[int]) -> int:
        """How many tokens of ``sequence`` differ from re-tokenizing ``messages`` from scratch.

        0 means the incremental sequence equals the template's rendering. A positive count is not an
        error — the trained tokens are still the sampled ones — but it says the model would see a
        slightly different sequence if the conversation were re-rendered (e.g. BPE merges across a
        turn boundary), which users comparing against other frameworks want to know.
        """
        add_gen = bool(messages) and messages[-1].role != "assistant"
        reference = self.encode(self.render(messages, add_generation_prompt=add_gen))
        diff = sum(a != b for a, b in zip(reference, sequence, strict=False))
        return diff + abs(len(reference) - len(sequence))
