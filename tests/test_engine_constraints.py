"""Structured generation in the engine: constraints enforced per row inside continuous batching,
logprobs under the masked distribution, the compile cache, and bad constraints refused."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import pytest
import torch
from pydantic import ValidationError

from horizonrl.engine.base import SamplingParams
from horizonrl.engine.constraints import Constraint, ConstraintError, replay_masks
from horizonrl.engine.hf import HFEngine
from horizonrl.toolcalls import format_instructions, parse_tool_calls
from horizonrl.toolformats import FORMATS, detect, tool_format
from horizonrl.types import ToolSpec

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{2,6}$"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "kind": {"enum": ["alpha", "beta"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    },
    "required": ["name", "n", "kind", "tags"],
    "additionalProperties": False,
}
CALC = ToolSpec(
    name="calculator",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string", "maxLength": 12}},
        "required": ["expression"],
        "additionalProperties": False,
    },
)
FINISH = ToolSpec(
    name="finish",
    parameters={
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": False,
    },
)


@pytest.fixture
def tiny(tiny_model_and_tokenizer):
    """The session's tiny random model (conftest), read-only here."""
    return tiny_model_and_tokenizer


@pytest.fixture
async def engine(tiny):
    model, tokenizer = tiny
    eng = HFEngine(model, tokenizer)
    yield eng
    await eng.close()


def _text(tokenizer, completion) -> str:
    ids = [t for t in completion.token_ids if t != tokenizer.eos_token_id]
    return tokenizer.decode(ids)


async def test_constrained_and_free_rows_share_a_batch_and_every_constrained_reply_is_valid(tiny, engine):
    _, tokenizer = tiny
    prompt = tokenizer.encode("Write the record:")
    json_params = [
        SamplingParams(temperature=1.0, seed=s, max_new_tokens=80, constraint=Constraint(json_schema=SCHEMA))
        for s in range(6)
    ]
    free = SamplingParams(temperature=0.0, max_new_tokens=12)
    regex = SamplingParams(
        temperature=1.0, seed=7, max_new_tokens=20, constraint=Constraint(regex=r"\d{3}-[a-z]{2}")
    )
    choice = SamplingParams(temperature=0.0, max_new_tokens=10, constraint=Constraint(choice=("yes", "no")))
    out = await asyncio.gather(*(engine.generate(prompt, p) for p in [*json_params, free, regex, choice]))
    assert engine.stats["batches"] == 1  # all in one batch
    for completion in out[:6]:
        assert completion.finish_reason == "stop" and completion.constraint_met is True
        jsonschema.validate(json.loads(_text(tokenizer, completion)), SCHEMA)
    assert out[6].constraint_met is None
    assert re.fullmatch(r"\d{3}-[a-z]{2}", _text(tokenizer, out[7]))
    assert _text(tokenizer, out[8]) in ("yes", "no")
    # the free (greedy) row is decoded exactly as it is alone: masks never leak across rows
    alone = await engine.generate(prompt, free)
    assert alone.token_ids == out[6].token_ids


async def test_logprobs_are_under_the_masked_distribution_and_replay_rebuilds_the_masks(tiny, engine):
    model, tokenizer = tiny
    prompt = tokenizer.encode("Call a tool:")
    constraint = Constraint(tools=(CALC, FINISH))
    params = SamplingParams(temperature=0.8, seed=3, max_new_tokens=60, constraint=constraint)
    completion = await engine.generate(prompt, params)
    assert completion.constraint_met is True
    text = _text(tokenizer, completion)
    body = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert body["name"] in ("calculator", "finish")
    masks = replay_masks(
        engine.decoder.constraints.matcher(constraint), completion.token_ids, engine.vocab_size
    )
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion.token_ids])).logits[0, len(prompt) - 1 : -1]
    logp = torch.log_softmax(logits.masked_fill(~masks, float("-inf")) / 0.8, dim=-1)
    expected = logp.gather(-1, torch.tensor(completion.token_ids)[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=1e-4)
    forced = masks.sum(-1) == 1  # tokens the constraint forced carry no choice: logprob 0
    assert forced.any() and torch.all(torch.tensor(completion.logprobs)[forced] == 0.0)


async def test_a_constraint_cut_off_by_max_new_tokens_ends_with_length(tiny, engine):
    _, tokenizer = tiny
    params = SamplingParams(
        temperature=1.0, seed=1, max_new_tokens=3, constraint=Constraint(json_schema=SCHEMA)
    )
    completion = await engine.generate(tokenizer.encode("x"), params)
    assert completion.finish_reason == "length" and completion.constraint_met is False


async def test_compiled_constraints_are_cached(tiny, engine):
    _, tokenizer = tiny
    params = SamplingParams(temperature=0.0, max_new_tokens=40, constraint=Constraint(json_schema=SCHEMA))
    await asyncio.gather(*(engine.generate(tokenizer.encode(f"p{i}"), params) for i in range(3)))
    stats = engine.stats
    assert stats["constraint_compiles"] == 1 and stats["constraint_cache_hits"] == 2


@pytest.mark.parametrize(
    ("constraint", "culprit"),
    [
        ({"json_schema": {"type": "objekt"}}, "json_schema is not a valid JSON Schema"),
        ({"regex": "[a-"}, "regex does not compile"),
        ({"grammar": "start: foo"}, "grammar does not compile"),
    ],
)
async def test_a_constraint_that_does_not_compile_is_refused_with_one_line(tiny, engine, constraint, culprit):
    _, tokenizer = tiny
    params = SamplingParams(max_new_tokens=4, constraint=Constraint(**constraint))
    with pytest.raises(ConstraintError, match=culprit) as info:
        await engine.generate(tokenizer.encode("x"), params)
    assert "\n" not in str(info.value)
    assert engine.stats["requests"] == 0  # nothing was queued


def test_a_constraint_sets_exactly_one_kind():
    with pytest.raises(ValidationError, match="exactly one of"):
        Constraint(regex="a", choice=("a",))
    with pytest.raises(ValidationError, match="exactly one of"):
        Constraint()
    with pytest.raises(ValidationError, match="unknown tool-call format 'xml'; valid: hermes"):
        Constraint(tools=(CALC,), tool_format="xml")


@pytest.mark.parametrize("name", sorted(FORMATS))
async def test_each_tool_call_format_is_enforced(tiny, engine, name):
    _, tokenizer = tiny
    fmt = tool_format(name)
    constraint = Constraint(tools=(CALC, FINISH), tool_format=name, parallel_tool_calls=True)
    params = SamplingParams(temperature=1.0, seed=5, max_new_tokens=120, constraint=constraint)
    completion = await engine.generate(tokenizer.encode("Use the tools."), params)
    text = _text(tokenizer, completion)
    assert completion.constraint_met is True, text
    # the canonical rendering of what was parsed is the text itself
    calls = _parse(fmt, text)
    assert calls and fmt.render(calls) == text
    # the agent's parser reads every family's calls as the grammar writes them
    parsed = parse_tool_calls(text)
    assert parsed.ok and [(c.name, c.arguments) for c in parsed.calls] == calls


def _parse(fmt, text: str) -> list[tuple[str, dict]]:
    if fmt.array:
        objects = json.loads(text.removeprefix(fmt.open))
    else:
        parts = [
            p.removeprefix(fmt.open).removesuffix(fmt.close) for p in text.split(fmt.close + fmt.separator)
        ]
        objects = [json.loads(p.removeprefix(fmt.open).removesuffix(fmt.close)) for p in parts]
    return [(o["name"], o[fmt.arguments_key]) for o in objects]


async def test_tools_or_text_admits_prose_or_a_valid_call_but_no_broken_call(tiny, engine):
    _, tokenizer = tiny
    constraint = Constraint(tools=(CALC,), allow_text=True)
    matcher = engine.decoder.constraints.matcher
    good_call = tokenizer.encode(
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'
    )
    prose = tokenizer.encode("The answer is 3.")
    broken = tokenizer.encode('<tool_call>\n{"name": "calc"}')
    for ids, ok in [(good_call, True), (prose, True), (broken, False)]:
        m = matcher(constraint)
        assert (m.try_consume_tokens(ids) == len(ids) and m.is_accepting()) is ok


def test_detect_reads_the_tool_call_format_off_a_chat_template(tokenizer):
    assert (
        detect("{% for tool_call in message.tool_calls %}<tool_call>\n{{ tool_call }}</tool_call>")
        == "hermes"
    )
    assert detect("[TOOL_CALLS] [{{ tool_calls }}]") == "mistral"
    assert detect('<|python_tag|>{"name": ...}') == "llama3_json"
    assert detect(tokenizer.chat_template) is None  # SmolLM2's ChatML has no tool support


@pytest.mark.parametrize(
    ("name", "shows"),
    [("hermes", "<tool_call>"), ("llama3_json", '"parameters"'), ("mistral", "[TOOL_CALLS]")],
)
def test_the_system_prompt_teaches_the_format_the_turns_are_held_to(name, shows):
    text = format_instructions([CALC], name)
    assert shows in text and tool_format(name).render([("calculator", {"expression": "..."})]) in text
