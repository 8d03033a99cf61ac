"""Training memory and time per token: `model.gradient_checkpointing` and the allocator setting.

One training step of the embedded default with LoRA on one trajectory of ``L`` tokens (a long prompt
such as a BFCL world's tool docs, and a short reply with the loss): the trainer's own forward and
backward (``accumulate_gradients`` with the NLL loss, as SFT runs it) and an AdamW step. One such row
fills a micro-batch, so ``micro_batch_tokens`` cannot bound its memory. Two settings can:

- ``model.gradient_checkpointing`` (off / on): keep each decoder layer's input only, recompute the
  rest in the backward pass;
- ``engine.mmap_threshold_mib`` (0: glibc's sliding mmap threshold / 1: a fixed 1 MiB one). It is
  process-wide, so it also decides where the trainer's activations (1-100 MiB each) are allocated:
  with the sliding threshold they come from the heap, where freed blocks stay resident.

Each (length, settings) runs in a fresh process, so its peak RSS is its own; ``added_gib`` is the
peak above the process after loading the model. Prints ``name=value`` lines, then the ratios at the
longest length against both settings off.

``--horizon-train`` measures the same setting where users meet it: ``horizon train
configs/evolve_bfcl.yaml`` (BFCL's own tasks, one SFT step of 8 oracle demonstrations whose prompts
hold the classes' tool docs, one small RL step), once with ``model.gradient_checkpointing=true`` and
once with ``false``, each a fresh process; it prints the run's peak resident memory at the end of
its SFT stage and of the run (``summary.json``), and the ratio.

    python benchmarks/train_memory.py [--lengths 1024,2048,4096] [--quick]
    python benchmarks/train_memory.py --horizon-train [--out runs/train_memory]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from machine import machine_description

REPLY_TOKENS = 48
SETTINGS = [(False, 0), (True, 0), (False, 1), (True, 1)]  # (checkpointing, mmap_threshold_mib)


def measure(length: int, checkpointing: bool, mmap_mib: int, model_path: str, dtype: str) -> dict[str, float]:
    """One training step in this process; returns its memory and time."""
    import torch

    from horizonrl.memory import map_large_blocks, peak_rss_gib
    from horizonrl.model_config import ModelConfig
    from horizonrl.models import load_model
    from horizonrl.optim import make_optimizer, optimizer_step
    from horizonrl.train.gradients import accumulate_gradients, nll_loss
    from horizonrl.types import Trajectory

    if mmap_mib:
        map_large_blocks(mmap_mib * 2**20)
    cfg = ModelConfig(path=model_path, dtype=dtype, finetune="lora", gradient_checkpointing=checkpointing)
    model, tokenizer = load_model(cfg, trainable=True)
    text = " ".join(f"def tool_{i}(path: str, mode: int = {i}) -> dict: ..." for i in range(length))
    ids = tokenizer(text)["input_ids"]
    prompt = (ids * (1 + length // len(ids)))[: length - REPLY_TOKENS]
    reply = ids[:REPLY_TOKENS]
    traj = Trajectory(
        id="t",
        task_id="t",
        group_id="g",
        env="bench",
        messages=[],
        finish="finished",
        prompt_ids=prompt,
        response_ids=reply,
        loss_mask=[1] * REPLY_TOKENS,
        logprobs=[0.0] * REPLY_TOKENS,
    )
    optimizer, scheduler = make_optimizer(model, 1e-4, 0.0, 0)
    loaded = peak_rss_gib()
    start = time.perf_counter()
    loss = nll_loss(REPLY_TOKENS)
    accumulate_gradients(model, [traj], None, loss, tokenizer.pad_token_id, length, 1.0, None)
    optimizer_step(model, optimizer, scheduler, 1.0)
    step_s = time.perf_counter() - start
    peak = peak_rss_gib()
    threads = torch.get_num_threads()
    return {"peak_gib": peak, "added_gib": peak - loaded, "step_s": step_s, "threads": threads}


HORIZON_TRAIN = [
    "env.tasks_file=null",  # BFCL's own multi_turn_base tasks (split test)
    "rollout.split=test",
    "sft.split=test",
    "sft.num_demos=8",
    "sft.batch_size=8",  # one SFT step
    "train.steps=1",
    "train.tasks_per_step=1",
    "train.group_size=2",
    "train.mini_batches=1",
    "eval.num_tasks=1",
]


def through_horizon_train(out: str) -> None:
    """``horizon train`` with and without gradient checkpointing (see the module doc)."""
    peaks = {}
    for on in (False, True):
        name = f"checkpointing_{'on' if on else 'off'}"
        cmd = [sys.executable, "-m", "horizonrl.cli", "train", "configs/evolve_bfcl.yaml", *HORIZON_TRAIN]
        cmd += [f"model.gradient_checkpointing={str(on).lower()}", f"output_dir={out}", f"name={name}"]
        done = subprocess.run([*cmd, "--overwrite"], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"{name}: {(done.stderr or done.stdout).strip()[-800:]}")
        summary = json.loads(Path(out, name, "summary.json").read_text(encoding="utf-8"))
        stages = summary["peak_rss_gib_by_stage"]
        peaks[on] = stages["sft"]
        print(
            f"horizon_train_{name}_peak_gib_after_load={stages['load']:.2f} "
            f"peak_gib_after_sft={stages['sft']:.2f} peak_gib_run={summary['peak_rss_gib']:.2f}",
            flush=True,
        )
    print(f"horizon_train_sft_peak_ratio_on_vs_off={peaks[True] / peaks[False]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="1024,2048,4096", help="trajectory lengths in tokens")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "auto"])
    parser.add_argument("--quick", action="store_true", help="the tiny random model at 256 and 512 tokens")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: LENGTH,on|off,MIB
    parser.add_argument("--horizon-train", action="store_true", help="through `horizon train` on BFCL")
    parser.add_argument("--out", default="runs/train_memory", help="--horizon-train: where the runs go")
    args = parser.parse_args()
    if args.horizon_train:
        print(f"machine={machine_description()} config=configs/evolve_bfcl.yaml")
        through_horizon_train(args.out)
        return
    if args.quick:
        args.model, args.lengths = "tiny-random", "256,512"
    if args.one:
        length, setting, mib = args.one.split(",")
        print(json.dumps(measure(int(length), setting == "on", int(mib), args.model, args.dtype)))
        return
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        parser.error(f"--lengths must be comma-separated token counts like 1024,2048 (got {args.lengths!r})")
    if not lengths or min(lengths) <= REPLY_TOKENS:
        parser.error(f"--lengths must each exceed the {REPLY_TOKENS}-token reply (got {args.lengths!r})")
    print(f"machine={machine_description()} model={args.model} dtype={args.dtype}")
    results: dict[tuple[int, bool, int], dict[str, float]] = {}
    for length in lengths:
        for checkpointing, mib in SETTINGS:
            cmd = [sys.executable, __file__, "--model", args.model, "--dtype", args.dtype]
            cmd += ["--one", f"{length},{'on' if checkpointing else 'off'},{mib}"]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                sys.exit(f"length {length}, checkpointing {checkpointing}: {done.stderr.strip()[-800:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results[length, checkpointing, mib] = result
            print(
                f"length={length} checkpointing={'on' if checkpointing else 'off'} mmap_threshold_mib={mib} "
                f"peak_gib={result['peak_gib']:.2f} added_gib={result['added_gib']:.2f} "
                f"mib_per_token={1024 * result['added_gib'] / length:.2f} step_s={result['step_s']:.1f} "
                f"threads={result['threads']}",
                flush=True,
            )
    longest = max(lengths)
    plain = results[longest, False, 0]
    for checkpointing, mib in SETTINGS[1:]:
        r = results[longest, checkpointing, mib]
        name = f"checkpointing_{'on' if checkpointing else 'off'}_mmap_{mib}"
        print(f"{name}_added_memory_ratio_{longest}={r['added_gib'] / max(plain['added_gib'], 1e-9):.2f}")
        print(f"{name}_step_time_ratio_{longest}={r['step_s'] / plain['step_s']:.2f}")


if __name__ == "__main__":
    main()
