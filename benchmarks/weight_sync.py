"""Weight sync to a real ``horizon serve`` with the embedded model: is the served policy the trainer's
after each sync, and what does a sync cost?

A run's stages are replayed against one server (SmolLM2-135M, float32 on both sides so that
"the same policy" means the same greedy tokens): SFT (a LoRA adapter merged into the trainer's
base), then two RL steps (a LoRA adapter on that base, changed between steps). After each sync, 16
calc prompts are completed greedily (48 new tokens) by the server and by the in-process engine on
the trainer's policy, and the completions are compared token for token. Both syncs are measured,
side by side in one run: ``vllm_lora`` (the policy as one adapter, SFT and RL concatenated, loaded by
``/v1/load_lora_adapter``) first, while the server still holds its original base, then ``horizon``
(the whole merged policy written to disk and swapped in by ``/v1/horizon/weights``). The adapters
are random (``--scale`` sets their size), which moves greedy completions as much as training does.

Prints ``name=value`` lines: per sync ``<mode>_sync<k>_s`` and ``<mode>_sync<k>_identical`` (of 16),
then ``<mode>_sync_s_mean`` and, last, ``identical_all`` (1 when every completion after every sync
was identical).

    python benchmarks/weight_sync.py [--scale 0.02]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import tempfile
import time
from pathlib import Path

import torch

from horizonrl.config import load_config
from horizonrl.engine.base import SamplingParams
from horizonrl.engine.hf import HFEngine
from horizonrl.engine.remote import OpenAIEngine
from horizonrl.envs.factory import make_tasks
from horizonrl.models import load_base
from horizonrl.policy import stage_from_peft
from horizonrl.serve.server import serve_in_subprocess
from horizonrl.trainable import wrap_lora

ROOT = Path(__file__).resolve().parents[1]
FLOAT32 = ["model.dtype=float32", "engine.dtype=float32"]
TOKEN = "bench-sync"


def randomize(model: torch.nn.Module, seed: int, scale: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)


def prompts(config, tokenizer, n: int) -> list[list[int]]:
    out = []
    for task in make_tasks(config.env, "test", n, 0):
        messages = [{"role": "user", "content": task.data["question"]}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def greedy(engine, batch: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_new_tokens=48)

    async def go():
        done = await asyncio.gather(*(engine.generate(p, params) for p in batch))
        if isinstance(engine, OpenAIEngine):  # its HTTP clients belong to this loop
            await engine.close()
        return done

    return [c.token_ids for c in asyncio.run(go())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=0.02, help="std of the random LoRA B weights")
    parser.add_argument("--prompts", type=int, default=16)
    args = parser.parse_args()
    os.chdir(ROOT)
    config = load_config("configs/calc.yaml", FLOAT32)
    loaded = load_base(config.model)
    original, tokenizer = loaded.base.eval(), loaded.tokenizer
    batch = prompts(config, tokenizer, args.prompts)

    sft = wrap_lora(copy.deepcopy(original), config.model.lora)
    randomize(sft, 1, args.scale)
    stages = [stage_from_peft(sft, "sft")]
    base = sft.merge_and_unload().eval()
    steps: list[tuple[str, object]] = [("sft", base)]
    for k in (2, 3):
        policy = wrap_lora(copy.deepcopy(base), config.model.lora)
        randomize(policy, k, args.scale)
        steps.append((f"rl{k - 1}", policy))

    figures: dict[str, float] = {}
    identical_all = True
    root = Path(tempfile.mkdtemp(prefix="bench-sync-"))
    with serve_in_subprocess(
        "configs/calc.yaml", [*FLOAT32, "name=served"], token=TOKEN, checkpoint_roots=[str(root)]
    ) as (url, _):
        for mode in ("vllm_lora", "horizon"):
            remote = OpenAIEngine(
                f"{url}/v1",
                "served",
                tokenizer,
                api_key=TOKEN,
                max_context=8192,
                weight_sync=mode,
                sync_dir=str(root / mode),
            )
            times = []
            for k, (label, policy) in enumerate(steps, start=1):
                start = time.perf_counter()
                remote.update_weights(policy, stages)
                times.append(time.perf_counter() - start)
                plain = copy.deepcopy(policy).merge_and_unload() if hasattr(policy, "peft_config") else policy
                local = HFEngine(plain.eval(), tokenizer, max_batch_size=32, seed=0)
                want, got = greedy(local, batch), greedy(remote, batch)
                same = sum(a == b for a, b in zip(want, got, strict=True))
                identical_all &= same == len(batch)
                figures[f"{mode}_sync{k}_{label}_s"] = times[-1]
                figures[f"{mode}_sync{k}_{label}_identical"] = float(same)
            figures[f"{mode}_sync_s_mean"] = sum(times) / len(times)
    for key, value in figures.items():
        print(f"{key}={value:.4g}")
    print(f"prompts={len(batch)}")
    print(f"identical_all={int(identical_all)}")


if __name__ == "__main__":
    main()
