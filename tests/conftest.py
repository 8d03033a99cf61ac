"""Shared fixtures: the real SmolLM2 tokenizer, a tiny random model with it, and an engine."""

from __future__ import annotations

import json

import pytest

from horizonrl.engine.base import Completion, SamplingParams


@pytest.fixture(scope="session")
def tokenizer():
    from horizonrl.models import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_model_and_tokenizer():
    from horizonrl.models import tiny_random_model

    return tiny_random_model(seed=0)


class ScriptedEngine:
    """A test double for the model: answers each generate call with the next scripted text.

    It lets loop tests dictate exactly what the "model" writes (a repeated call, a malformed reply)
    — behaviour a real random model cannot be steered to. It honours the Engine contract: token ids
    with the eos token, one logprob per token, finish_reason, and max_new_tokens truncation.
    """

    def __init__(self, tokenizer, texts: list[str], logprob: float = -0.5) -> None:
        self.tokenizer = tokenizer
        self.texts = list(texts)
        self.logprob = logprob
        self.calls = 0
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        self.prompts.append(list(prompt_ids))
        text = self.texts[min(self.calls, len(self.texts) - 1)]
        self.calls += 1
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        reason = "stop"
        if len(ids) > params.max_new_tokens:
            ids, reason = ids[: params.max_new_tokens], "length"
        return Completion(token_ids=ids, logprobs=[self.logprob] * len(ids), finish_reason=reason)

    def update_weights(self, policy) -> None:
        pass


@pytest.fixture
def scripted_engine(tokenizer):
    def make(texts: list[str], logprob: float = -0.5) -> ScriptedEngine:
        return ScriptedEngine(tokenizer, texts, logprob)

    return make


@pytest.fixture
def flights_oracle_eval(tmp_path):
    """``horizon eval configs/flights.yaml --policy oracle`` in this process, with extra overrides
    (output under ``tmp_path``); returns its ``--json`` summary after checking it exited 0."""
    from typer.testing import CliRunner

    from horizonrl.cli import app

    def run(*overrides: str) -> dict:
        summary = tmp_path / "summary.json"
        command = ["eval", "configs/flights.yaml", "--policy", "oracle", "--json", str(summary)]
        result = CliRunner().invoke(app, [*command, f"output_dir={tmp_path}", *overrides])
        assert result.exit_code == 0, result.output
        return json.loads(summary.read_text())

    return run
