"""The same rollouts on ``runtime.backend=local`` and on a local Ray cluster, and two engine
replicas against one.

1. Local against Ray: ``--tasks`` calc tasks x 2 samples, greedy, in this process and then with
   env workers and one engine replica as Ray actors. The records must be identical in content and
   count (``records_identical``); ``ray_vs_local_time`` is the rollout's wall time on Ray over
   local, each after a two-episode warm-up (cluster and actor start-up are reported apart, as
   ``ray_start_s``). Run it on an idle machine: the in-process engine uses every core, a replica
   one thread per CPU it reserves, so other load skews the two differently.
2. Replicas: a workload with more episodes than one replica batches (``engine.max_batch_size``
   8, 8 x ``--tasks`` episodes), one replica against two, each replica with half the cores
   (``speedup_2_replicas``, rollout wall time of one over two).

Prints ``name=value`` lines, ``ray_vs_local_time`` last.

    python benchmarks/scale_out.py [--quick] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from horizonrl.config import load_config
from horizonrl.envs.factory import make_tasks
from horizonrl.rollout.runner import run_rollouts
from horizonrl.train.runtime import build_runtime


def rollout(overrides: list[str], n_tasks: int, samples: int) -> tuple[list, float, float]:
    """(records, rollout seconds, start-up seconds) of one configuration."""
    config = load_config("configs/calc.yaml", overrides)
    t0 = time.perf_counter()
    runtime = build_runtime(config)
    started = time.perf_counter() - t0
    try:
        tasks = make_tasks(config.env, "train", n_tasks, 0)
        warm = make_tasks(config.env, "test", 2, 0)  # first requests pay one-off costs (kernels, caches)
        asyncio.run(run_rollouts(runtime.agent, runtime.backend.env_factory(), warm, 1, 2))
        t1 = time.perf_counter()
        records = list(
            asyncio.run(
                run_rollouts(runtime.agent, runtime.backend.env_factory(), tasks, samples, n_tasks * samples)
            )
        )
        return records, time.perf_counter() - t1, started
    finally:
        runtime.close()


def same(a, b) -> bool:
    return len(a) == len(b) and all(
        (x.id, x.prompt_ids, x.response_ids, x.loss_mask, x.finish, x.reward)
        == (y.id, y.prompt_ids, y.response_ids, y.loss_mask, y.finish, y.reward)
        for x, y in zip(a, b, strict=True)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny random model, 16 tasks")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tasks", type=int, default=None)
    args = parser.parse_args()
    model = "tiny-random" if args.quick else args.model
    n_tasks = args.tasks or (16 if args.quick else 32)
    # float32: greedy tokens then do not depend on how a batch is split over threads (in bfloat16
    # near-ties flip with the rounding of a different reduction order)
    base = [
        f"model.path={model}",
        "model.dtype=float32",
        "engine.dtype=float32",
        "sampling.temperature=0",
        "sampling.max_new_tokens=24",
        "agent.max_turns=4",
        "agent.max_malformed=2",
    ]
    # the replica reserves what the local engine uses, every core (its env workers a sliver)
    cores = os.cpu_count() or 2
    ray = [
        "runtime.backend=ray",
        "runtime.env_workers=2",
        "runtime.env_worker_cpus=0.25",
        f"runtime.engine_cpus={cores - 0.5}",
    ]

    local, local_s, _ = rollout(base, n_tasks, 2)
    remote, ray_s, ray_start = rollout([*base, *ray], n_tasks, 2)
    print(f"model={model}")
    print(f"episodes={len(local)}")
    print(f"records_identical={same(local, remote)}")
    print(f"local_s={local_s:.2f}")
    print(f"ray_s={ray_s:.2f}")
    print(f"ray_start_s={ray_start:.1f}")

    batch = [*base, "engine.max_batch_size=8"]
    half = (cores - 0.2) / 2
    one = [
        *batch,
        *ray,
        "runtime.engine_replicas=1",
        "runtime.env_worker_cpus=0.1",
        f"runtime.engine_cpus={half}",
    ]
    two = [
        *batch,
        *ray,
        "runtime.engine_replicas=2",
        "runtime.env_worker_cpus=0.1",
        f"runtime.engine_cpus={half}",
    ]
    _, one_s, _ = rollout(one, 4 * n_tasks, 2)
    _, two_s, _ = rollout(two, 4 * n_tasks, 2)
    print(f"replica_episodes={8 * n_tasks}")
    print(f"one_replica_s={one_s:.2f}")
    print(f"two_replicas_s={two_s:.2f}")
    print(f"speedup_2_replicas={one_s / two_s:.2f}")
    print(f"ray_vs_local_time={ray_s / local_s:.2f}")


if __name__ == "__main__":
    main()
