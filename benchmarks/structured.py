"""Structured generation: what the token masks cost, whether every reply is valid, and whether the
trainer sees the sampler's distribution.

Four measurements, printed as ``name=value`` lines:

1. **Mask overhead**: the engine's decode tokens/s at batch 8 with every row held to a JSON schema
   that cannot end within the token budget, against the same rows unconstrained (end-of-sequence
   ignored, so both decode exactly ``--tokens`` tokens per row); alternated ``--repeats`` times, the
   best of each counts. Headline ``mask_overhead_ratio`` (constrained / free tokens/s).
2. **Compile time**: a fresh compiler's time per new schema (p50, max) and per cached one.
3. **Validity**: ``--requests`` requests over 8 schemas (nested objects, enums, arrays, numbers with
   ranges, strings with patterns) through the engine, and the same through a real ``horizon serve``
   (``response_format`` json_schema, the official ``openai`` client): each reply parsed and validated
   with ``jsonschema``; a reply cut off by ``max_tokens`` counts as invalid.
4. **Sampler/trainer KL** under constraints: constrained calc episodes, then the trainer's logprobs
   of the same tokens with the replayed masks (``k3`` KL estimate and the largest gap).

    python benchmarks/structured.py [--quick] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import jsonschema
import torch

from horizonrl.agent.config import AgentConfig
from horizonrl.agent.loop import Agent
from horizonrl.engine.base import SamplingParams
from horizonrl.engine.constraints import Constraint, ConstraintCompiler
from horizonrl.engine.hf import HFEngine
from horizonrl.engine.replay import ConstraintReplay
from horizonrl.envs.calc import CalcEnv
from horizonrl.model_config import ModelConfig
from horizonrl.models import load_model
from horizonrl.serve.server import serve_in_subprocess
from horizonrl.train.logprobs import old_outputs

SCHEMAS: dict[str, dict] = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,12}$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "label": {
        "type": "object",
        "properties": {"label": {"enum": ["GOOD", "BAD", "UNSURE"]}, "confidence": {"type": "number"}},
        "required": ["label", "confidence"],
        "additionalProperties": False,
    },
    "steps": {
        "type": "object",
        "properties": {
            "steps": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"step": {"type": "integer", "minimum": 1}, "ok": {"type": "boolean"}},
                    "required": ["step", "ok"],
                    "additionalProperties": False,
                },
                "minItems": 1,
                "maxItems": 5,
            }
        },
        "required": ["steps"],
        "additionalProperties": False,
    },
    "address": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            "geo": {
                "type": "object",
                "properties": {
                    "lat": {"type": "number", "minimum": -90, "maximum": 90},
                    "lon": {"type": "number", "minimum": -180, "maximum": 180},
                },
                "required": ["lat", "lon"],
                "additionalProperties": False,
            },
        },
        "required": ["city", "zip", "geo"],
        "additionalProperties": False,
    },
    "tags": {
        "type": "array",
        "items": {"type": "string", "pattern": "^#[a-z]{2,8}$"},
        "minItems": 1,
        "maxItems": 4,
    },
    "flight": {
        "type": "object",
        "properties": {
            "origin": {"enum": ["SFO", "JFK", "LAX", "ORD"]},
            "destination": {"enum": ["SFO", "JFK", "LAX", "ORD"]},
            "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
            "cabin": {"enum": ["economy", "business"]},
        },
        "required": ["origin", "destination", "passengers", "cabin"],
        "additionalProperties": False,
    },
    "answer": {
        "type": "object",
        "properties": {"answer": {"type": "number"}, "unit": {"type": ["string", "null"], "maxLength": 8}},
        "required": ["answer", "unit"],
        "additionalProperties": False,
    },
    "lesson": {
        "type": "object",
        "properties": {
            "when": {"type": "string", "maxLength": 60},
            "do": {"type": "string", "maxLength": 60},
            "tool": {"enum": ["calculator", "finish", None]},
        },
        "required": ["when", "do", "tool"],
        "additionalProperties": False,
    },
}
#: a schema that cannot end within the overhead run's token budget (30+ objects)
LONG = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "word": {"type": "string", "maxLength": 12}},
        "required": ["id", "word"],
    },
    "minItems": 30,
}


def chat_prompt(tokenizer, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return tokenizer.encode(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    )


def mask_overhead(engine: HFEngine, tokenizer, tokens: int, repeats: int) -> None:
    prompts = [chat_prompt(tokenizer, f"List {30 + i} words with ids as JSON.") for i in range(8)]
    free = SamplingParams(temperature=1.0, max_new_tokens=tokens, seed=1)
    held = free.model_copy(update={"constraint": Constraint(json_schema=LONG)})
    eos = engine.eos_token_ids

    async def run(params: SamplingParams) -> float:
        before = engine.stats
        outs = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        after = engine.stats
        assert all(len(o.token_ids) == tokens for o in outs), "a row ended early"
        generated = after["generated_tokens"] - before["generated_tokens"]
        return generated / (after["generate_s"] - before["generate_s"])

    best = {"free": 0.0, "constrained": 0.0}
    for _ in range(repeats):
        engine.eos_token_ids = frozenset()  # free rows decode all ``tokens`` too
        best["free"] = max(best["free"], asyncio.run(run(free)))
        engine.eos_token_ids = eos
        best["constrained"] = max(best["constrained"], asyncio.run(run(held)))
    print(f"overhead_batch=8 overhead_tokens_per_row={tokens}")
    print(f"free_tokens_per_s={best['free']:.1f}")
    print(f"constrained_tokens_per_s={best['constrained']:.1f}")
    print(f"mask_overhead_ratio={best['constrained'] / best['free']:.3f}")


def compile_times(tokenizer, vocab: int, eos: frozenset[int]) -> None:
    compiler = ConstraintCompiler(tokenizer, vocab, eos)
    compiler.lltokenizer()  # built once per tokenizer, not per schema
    fresh, cached = [], []
    for schema in SCHEMAS.values():
        start = time.perf_counter()
        compiler.matcher(Constraint(json_schema=schema))
        fresh.append(time.perf_counter() - start)
        start = time.perf_counter()
        compiler.matcher(Constraint(json_schema=schema))
        cached.append(time.perf_counter() - start)
    print(f"compile_ms_p50={1000 * statistics.median(fresh):.2f} compile_ms_max={1000 * max(fresh):.2f}")
    print(f"compile_cached_ms_p50={1000 * statistics.median(cached):.3f}")


def requests_plan(n: int) -> list[tuple[str, int]]:
    names = list(SCHEMAS)
    return [(names[i % len(names)], i) for i in range(n)]


def valid(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False


def engine_validity(engine: HFEngine, tokenizer, n: int, max_tokens: int) -> None:
    async def one(name: str, i: int) -> tuple[bool, bool]:
        params = SamplingParams(
            temperature=1.0,
            seed=i,
            max_new_tokens=max_tokens,
            constraint=Constraint(json_schema=SCHEMAS[name]),
        )
        out = await engine.generate(chat_prompt(tokenizer, f"Give a {name} record as JSON."), params)
        ids = [t for t in out.token_ids if t not in engine.eos_token_ids]
        return valid(tokenizer.decode(ids), SCHEMAS[name]), out.finish_reason == "length"

    async def run() -> list[tuple[bool, bool]]:
        return await asyncio.gather(*(one(name, i) for name, i in requests_plan(n)))

    results = asyncio.run(run())
    ok = [v for v, _ in results]
    cut = sum(c for _, c in results)
    print(
        f"engine_valid={sum(ok)}/{len(ok)} engine_valid_rate={sum(ok) / len(ok):.3f} "
        f"engine_cut_by_max_tokens={cut}"
    )


def server_validity(model: str, n: int, max_tokens: int) -> None:
    import openai

    overrides = [f"model.path={model}", "name=structured-bench"]

    async def run(url: str) -> list[tuple[bool, bool]]:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0, timeout=600)

        async def one(name: str, i: int) -> tuple[bool, bool]:
            reply = await client.chat.completions.create(
                model="structured-bench",
                messages=[{"role": "user", "content": f"Give a {name} record as JSON."}],
                temperature=1.0,
                seed=i,
                max_tokens=max_tokens,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True},
                },
            )
            choice = reply.choices[0]
            return valid(choice.message.content or "", SCHEMAS[name]), choice.finish_reason == "length"

        return await asyncio.gather(*(one(name, i) for name, i in requests_plan(n)))

    with serve_in_subprocess("configs/calc.yaml", overrides, token="bench") as (url, _):
        results = asyncio.run(run(url))
    ok = [v for v, _ in results]
    cut = sum(c for _, c in results)
    print(
        f"server_valid={sum(ok)}/{len(ok)} server_valid_rate={sum(ok) / len(ok):.3f} "
        f"server_cut_by_max_tokens={cut}"
    )


def sampler_trainer_kl(model, tokenizer, episodes: int) -> None:
    engine = HFEngine(model, tokenizer, seed=0)
    agent = Agent(
        tokenizer,
        engine,
        SamplingParams(temperature=1.0, max_new_tokens=96, seed=5),
        AgentConfig(constrain="tool_calls", max_turns=4),
        context_length=8192,
    )
    tasks = CalcEnv.make_tasks("train", episodes, 0, CalcEnv.Options())

    async def run():
        return await asyncio.gather(*(agent.run(CalcEnv(), t, f"{t.id}#0", t.id) for t in tasks))

    trajs = asyncio.run(run())
    old = old_outputs(model, trajs, engine.pad_token_id, 4096, 1.0, replay=ConstraintReplay(tokenizer, model))
    trainer, sampler = [], []
    for traj, row in zip(trajs, old["old_logprobs"], strict=True):
        for lp, s, m in zip(row, traj.logprobs, traj.loss_mask, strict=True):
            if m:
                trainer.append(lp)
                sampler.append(s)
    t, s = torch.tensor(trainer), torch.tensor(sampler)
    k3 = (torch.exp(t - s) - (t - s) - 1).mean()  # KL(sampler || trainer), k3 estimate
    turns = sum(len(x.constrained or []) for x in trajs)
    unmet = sum(x.metrics.get("constraint_unmet", 0) for x in trajs)
    print(f"kl_episodes={len(trajs)} kl_constrained_turns={turns} kl_turns_cut_by_max_tokens={unmet:.0f}")
    print(f"sampler_trainer_kl_k3={float(k3):.2e} max_abs_logprob_gap={float((t - s).abs().max()):.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="model path or alias")
    parser.add_argument("--quick", action="store_true", help="the tiny random model, few requests")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=160, help="per validity request")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per row in the overhead run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-server", action="store_true")
    parser.add_argument(
        "--only", choices=["validity", "kl"], help="run one part (validity: engine and server)"
    )
    args = parser.parse_args()
    if args.quick:
        args.model, args.requests, args.tokens, args.repeats = "tiny-random", 16, 32, 2
    model, tokenizer = load_model(ModelConfig(path=args.model, dtype="float32"))
    engine = HFEngine(model, tokenizer, max_batch_size=8)
    print(f"model={args.model} threads={torch.get_num_threads()}")
    if args.only is None:
        mask_overhead(engine, tokenizer, args.tokens, args.repeats)
        compile_times(tokenizer, engine.vocab_size, engine.eos_token_ids)
    if args.only in (None, "validity"):
        big = HFEngine(model, tokenizer, max_batch_size=32)
        engine_validity(big, tokenizer, args.requests, args.max_tokens)
        if not args.skip_server:
            server_validity(args.model, args.requests, args.max_tokens)
    if args.only in (None, "kl"):
        sampler_trainer_kl(model, tokenizer, 8 if args.quick else 16)


if __name__ == "__main__":
    main()
