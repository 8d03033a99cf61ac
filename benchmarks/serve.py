"""``horizon serve`` against the in-process engine on the same requests, and a weight swap.

32 chat requests (calc tasks with their tools, temperature 1, max_tokens 64, one seed each) are
answered twice per round: by the engine in this process (``engine.generate`` on the prompts the
server renders, all at once), and through a real ``horizon serve`` process by 32 concurrent
official ``openai`` clients. With the same seeds both sample the same tokens, so the work is
equal. Per served request the overhead is its latency at the client minus the engine time the
server reports for it (``horizon.engine_ms``): HTTP, JSON, the chat template, tool-call parsing,
and the client library, including the wait behind the other 31 requests in each single-threaded
Python loop (``overhead_ms``); and the part of it inside the server, from reading the body to the
answer being ready (``server_overhead_ms``, from ``horizon.server_ms``).
Then a policy artifact is swapped in through ``POST /v1/horizon/weights`` while 32 requests are
in flight: how long loading took, how long new requests were held back (drain + update), and the
copy into the engine. Last, four LoRA adapters are loaded (``POST /v1/load_lora_adapter``) and the
same 32 requests are answered on one adapter, then spread over the four (``model`` per request):
``mixed_vs_single_adapter`` is the second's tokens/s over the first's (rows of different adapters
share the decode steps, each adds its own LoRA products).

Prints ``name=value`` lines, ``served_vs_engine`` (served tokens/s over engine tokens/s) last.

    python benchmarks/serve.py [--quick] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import openai
import torch

from horizonrl.config import load_config
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.calc import CalcEnv, CalcOptions
from horizonrl.envs.factory import make_tasks
from horizonrl.seeds import derive_seed
from horizonrl.serve.server import serve_in_subprocess
from horizonrl.serve.service import PolicyService
from horizonrl.train.runtime import build_runtime

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench"


async def _requests(config, n: int):
    env = CalcEnv(CalcOptions(min_ops=2, max_ops=2))
    tasks = make_tasks(config.env, "test", n, 7)
    out = []
    for task in tasks:
        out.append([m.to_dict() for m in await env.reset(task)])
    return out, [t.to_openai() for t in env.tools]


async def engine_round(runtime, service, conversations, tools, max_tokens: int) -> tuple[float, int]:
    from horizonrl.serve.messages import to_messages, tool_specs
    from horizonrl.serve.protocol import ChatCompletionRequest

    prompts = []
    for messages in conversations:
        req = ChatCompletionRequest.model_validate({"model": "m", "messages": messages, "tools": tools})
        chat = service.chat_format(tool_specs(req.tools, None))
        prompts.append(chat.prompt_ids(to_messages(req.messages)))
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=max_tokens, seed=derive_seed(i, 0))
        for i in range(len(prompts))
    ]
    start = time.perf_counter()
    outs = await asyncio.gather(
        *(runtime.engine.generate(p, q) for p, q in zip(prompts, params, strict=True))
    )
    return time.perf_counter() - start, sum(len(o.token_ids) for o in outs)


async def served_round(
    url: str, conversations, tools, max_tokens: int, models: tuple[str, ...] = ("calc",)
) -> tuple[float, int, list[float]]:
    """The requests answered by the server, request ``i`` by ``models[i % len(models)]``."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0, timeout=600)

    async def ask(i: int, messages):
        t0 = time.perf_counter()
        r = await client.chat.completions.create(
            model=models[i % len(models)],
            messages=messages,
            tools=tools,
            temperature=1.0,
            max_tokens=max_tokens,
            seed=i,
        )
        latency_ms = 1000 * (time.perf_counter() - t0)
        info = r.model_extra["horizon"]
        return (
            r.usage.completion_tokens,
            latency_ms - info["engine_ms"],
            info["server_ms"] - info["engine_ms"],
        )

    start = time.perf_counter()
    results = await asyncio.gather(*(ask(i, m) for i, m in enumerate(conversations)))
    wall = time.perf_counter() - start
    await client.close()
    return wall, sum(r[0] for r in results), [r[1] for r in results], [r[2] for r in results]


def make_policy(config, out: Path) -> None:
    """A LoRA policy artifact of the served base with perturbed adapters (what a trainer saves)."""
    from horizonrl.models import load_base
    from horizonrl.policy import write_policy
    from horizonrl.trainable import wrap_lora

    loaded = load_base(config.model)
    model = wrap_lora(loaded.base, config.model.lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    write_policy(out, model=model, tokenizer=loaded.tokenizer, base=loaded.identity, description="benchmark")


def load_adapters(config, url: str, out: Path, n: int) -> list[str]:
    """``n`` LoRA adapters of the served base (random non-zero B), saved under ``out`` and loaded
    into the server; their names."""
    from horizonrl.models import load_base
    from horizonrl.trainable import wrap_lora

    names = []
    for i in range(n):
        model = wrap_lora(load_base(config.model).base, config.model.lora)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.01 * (i + 1))
        model.save_pretrained(out / f"adapter{i}")
        answer = httpx.post(
            f"{url}/v1/load_lora_adapter",
            json={"lora_name": f"adapter{i}", "lora_path": str(out / f"adapter{i}")},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=600,
        )
        answer.raise_for_status()
        names.append(f"adapter{i}")
    return names


async def swap_during_load(url: str, conversations, tools, checkpoint: Path) -> dict:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0, timeout=600)
    busy = [
        asyncio.create_task(
            client.chat.completions.create(model="calc", messages=m, tools=tools, max_tokens=48, seed=i)
        )
        for i, m in enumerate(conversations)
    ]
    await asyncio.sleep(0.5)
    async with httpx.AsyncClient(timeout=600) as http:
        answer = await http.post(
            f"{url}/v1/horizon/weights",
            json={"checkpoint": str(checkpoint)},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
    answer.raise_for_status()
    replies = await asyncio.gather(*busy)
    after = await client.chat.completions.create(
        model="calc", messages=conversations[0], tools=tools, max_tokens=4
    )
    await client.close()
    versions = sorted({r.model_extra["horizon"]["policy_version"] for r in replies})
    return {
        **answer.json(),
        "in_flight_versions": versions,
        "after_version": after.model_extra["horizon"]["policy_version"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny random model, 8 clients, 1 round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n, max_tokens, rounds = (8, 16, 1) if args.quick else (32, 64, args.rounds)
    overrides = ["name=calc"] + (["model.path=tiny-random", "model.dtype=float32"] if args.quick else [])
    config = load_config(ROOT / "configs" / "calc.yaml", overrides)
    conversations, tools = asyncio.run(_requests(config, n))
    runtime = build_runtime(config)
    service = PolicyService(runtime.engine, runtime.tokenizer, "calc")
    engine_walls, served_walls, engine_tokens, served_tokens, overheads, inside = [], [], [], [], [], []
    with serve_in_subprocess("configs/calc.yaml", overrides, token=TOKEN) as (url, _):
        asyncio.run(served_round(url, conversations[:4], tools, 8))  # warm-up
        asyncio.run(engine_round(runtime, service, conversations[:4], tools, 8))
        for _ in range(rounds):
            wall, tokens = asyncio.run(engine_round(runtime, service, conversations, tools, max_tokens))
            engine_walls.append(wall)
            engine_tokens.append(tokens)
            wall, tokens, over, server_over = asyncio.run(served_round(url, conversations, tools, max_tokens))
            served_walls.append(wall)
            served_tokens.append(tokens)
            overheads += over
            inside += server_over
        with tempfile.TemporaryDirectory() as tmp:
            make_policy(config, Path(tmp) / "policy")
            swap = asyncio.run(swap_during_load(url, conversations, tools, Path(tmp) / "policy"))
            adapters = load_adapters(config, url, Path(tmp), 4)
            asyncio.run(served_round(url, conversations[:4], tools, 8, tuple(adapters)))  # warm-up
            single_tps, mixed_tps = [], []
            for _ in range(rounds):
                for models, out in (((adapters[0],), single_tps), (tuple(adapters), mixed_tps)):
                    wall, tokens, _, _ = asyncio.run(
                        served_round(url, conversations, tools, max_tokens, models)
                    )
                    out.append(tokens / wall)
    engine_tps = statistics.median(t / w for t, w in zip(engine_tokens, engine_walls, strict=True))
    served_tps = statistics.median(t / w for t, w in zip(served_tokens, served_walls, strict=True))
    overheads.sort()
    inside.sort()
    print(f"clients={n}")
    print(f"rounds={rounds}")
    print(f"same_tokens={engine_tokens == served_tokens}")
    print(f"engine_tokens_per_s={engine_tps:.1f}")
    print(f"served_tokens_per_s={served_tps:.1f}")
    print(f"overhead_ms_p50={statistics.median(overheads):.1f}")
    print(f"overhead_ms_p95={overheads[int(0.95 * (len(overheads) - 1))]:.1f}")
    print(f"server_overhead_ms_p50={statistics.median(inside):.1f}")
    print(f"server_overhead_ms_p95={inside[int(0.95 * (len(inside) - 1))]:.1f}")
    print(f"swap_load_s={swap['load_s']}")
    print(f"swap_paused_s={swap['paused_s']}")
    print(f"swap_update_s={swap['update_s']}")
    print(f"swap_in_flight_versions={swap['in_flight_versions']}")
    print(f"swap_after_version={swap['after_version']}")
    print(f"single_adapter_tokens_per_s={statistics.median(single_tps):.1f}")
    print(f"mixed_adapters_tokens_per_s={statistics.median(mixed_tps):.1f}")
    print(f"mixed_vs_single_adapter={statistics.median(mixed_tps) / statistics.median(single_tps):.3f}")
    print(f"served_vs_engine={served_tps / engine_tps:.3f}")


if __name__ == "__main__":
    main()
