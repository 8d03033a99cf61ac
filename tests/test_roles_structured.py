"""Structured replies of roles: a pydantic model in, a validated object out; enforced by the engine on
the policy/local backends, read from free text with ``structured: parse``, unusable replies counted."""

from __future__ import annotations

import asyncio
from typing import Literal

import jsonschema
from pydantic import BaseModel, Field

from horizonrl.engine.hf import HFEngine
from horizonrl.roles import Roles, RolesConfig
from horizonrl.roles.structured import output_schema, parse_reply

QUESTION = [{"role": "user", "content": "Was step 3 useful? Answer as JSON."}]


class Step(BaseModel):
    step: int = Field(ge=1, le=20)
    label: Literal["GOOD", "BAD"]


class Verdict(BaseModel):
    steps: list[Step] = Field(max_length=4)
    reason: str = Field("", max_length=40)


def test_output_schema_is_strict_everywhere():
    schema = output_schema(Verdict)
    assert schema["additionalProperties"] is False and schema["required"] == ["steps", "reason"]
    step = schema["$defs"]["Step"]
    assert step["additionalProperties"] is False and step["required"] == ["step", "label"]
    jsonschema.validators.validator_for(schema).check_schema(schema)


def test_parse_reply_takes_the_whole_text_or_its_first_object_and_says_why_not():
    assert parse_reply('{"steps": [], "reason": "x"}', Verdict).value == Verdict(steps=[], reason="x")
    reply = parse_reply('Sure! ```json\n{"steps": [{"step": 2, "label": "GOOD"}]}\n```', Verdict)
    assert reply.value.steps[0].label == "GOOD"
    assert parse_reply("I think it was good.", Verdict).error == "no JSON object in the reply"
    bad = parse_reply('{"steps": [{"step": 2, "label": "OK"}]}', Verdict)
    assert bad.value is None and bad.error.startswith("steps.0.label:")


async def test_policy_role_replies_are_held_to_the_schema(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    engine = HFEngine(model, tokenizer)
    roles = Roles(RolesConfig(), engine, tokenizer)
    judge = roles.get("judge")
    replies = await asyncio.gather(
        *(judge.structured(QUESTION, Verdict, temperature=1.0, seed=s, max_tokens=120) for s in range(8))
    )
    assert all(r.ok and r.enforced for r in replies), [r.error for r in replies]
    assert all(isinstance(r.value, Verdict) for r in replies)
    usage = roles.usage()["judge"]
    assert usage["structured"] == 8 and usage["unusable"] == 0
    # the same random model without enforcement: free text that is not the structure, counted
    parse = Roles(RolesConfig.model_validate({"judge": {"structured": "parse"}}), engine, tokenizer).get(
        "judge"
    )
    free = await asyncio.gather(
        *(parse.structured(QUESTION, Verdict, temperature=1.0, seed=s, max_tokens=30) for s in range(4))
    )
    assert not any(r.ok for r in free) and parse.usage.unusable == 4
    await engine.close()
