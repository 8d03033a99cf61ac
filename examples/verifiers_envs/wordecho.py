"""A single-turn verifiers env (verifiers 0.4, ``verifiers.v1``), written for verifiers as its users
write one: a taskset of task data rows, a task type whose ``@vf.reward`` and ``@vf.metric`` score the
finished trace. The model is asked to repeat a word; the reward is 1 when its reply is that word.

Run it through horizon: ``env.name: verifiers:examples/verifiers_envs/wordecho.py``.
"""

import verifiers.v1 as vf

SYSTEM_PROMPT = "Reply with the word you are asked for and nothing else."
WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "glass"]


class EchoData(vf.TaskData):
    answer: str
    """The word the reply must be."""


class EchoTask(vf.Task[EchoData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def exact(self, trace: vf.Trace) -> float:
        """1 when the reply, stripped of punctuation and case, is the word."""
        return float(trace.last_reply.strip().strip(".!\"'").lower() == self.data.answer)

    @vf.metric
    async def contains(self, trace: vf.Trace) -> float:
        """1 when the word appears anywhere in the reply."""
        return float(self.data.answer in trace.last_reply.lower())


class EchoTaskset(vf.Taskset[EchoTask, vf.TasksetConfig]):
    """Its own small dataset, made in code (nothing to download)."""

    def load(self):
        for word in WORDS:
            data = EchoData(prompt=f"Say the word: {word}", system_prompt=SYSTEM_PROMPT, answer=word)
            yield EchoTask(data, self.config.task)


__all__ = ["EchoTaskset"]
