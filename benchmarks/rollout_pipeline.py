"""The rollout pipeline against the lockstep baseline on the standard workload (BENCHMARKS.md).

Workload (seeded): 32 tasks x group 4 = 128 trajectories of the ``latency`` env — episodes of 2-8
turns whatever the model writes; log-normal latencies per call: init mean 1.0 s (sigma 0.5), step
0.2 s (sigma 1.0), eval 2.0 s (sigma 0.5). Engine: the real in-process engine with the tiny random
model, 16-48 new tokens per turn (greedy). The same limits in both modes: 32 init workers, 32 run
slots, 32 eval workers. ``--quick``: 16 tasks x 4, limits of 16, every latency halved (and the
memory probe compares 1 with 10 tasks instead of 32 with 320).

Prints ``lockstep_s``, ``pipeline_s``, ``ideal_s`` = max(the longest single trajectory's
init + run + eval, the sum of run-stage times / run slots) from the pipeline's own timings,
``efficiency`` = ideal_s / pipeline_s, the same trajectories' measured stage durations replayed
under the pipeline's rules (``benchmarks/replay.py``) in job order (``replay_job_order_s``:
what the pipeline does, knowing nothing of durations) and longest first (``replay_longest_first_s``:
a clairvoyant order no real scheduler has) and in 200 seeded random orders (``replay_random_orders``:
mean efficiency and the share reaching 0.8; the durations are drawn independently of anything a
scheduler sees before a trajectory starts, so any order it can choose is, in distribution, a
random one), ``peak_rss_growth`` (peak resident memory of a pipeline run
given 10x more tasks, relative to the 1x run; each in a fresh process, records streamed to a file
and not kept) and last ``speedup`` = lockstep_s / pipeline_s.

    python benchmarks/rollout_pipeline.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from replay import StageDurations, longest_first, lower_bound_s, replay_makespan  # benchmarks/replay.py

from horizonrl.agent.config import AgentConfig
from horizonrl.agent.loop import Agent
from horizonrl.engine.base import Completion, SamplingParams
from horizonrl.engine.hf import HFEngine
from horizonrl.envs.latency import LatencyEnv, LatencyOptions
from horizonrl.models import tiny_random_model
from horizonrl.rollout.base import RolloutLimits, make_jobs
from horizonrl.rollout.lockstep import run_lockstep
from horizonrl.rollout.pipeline import run_pipeline

GROUP = 4


class VaryingLengthEngine:
    """The real engine, asked for 16-48 new tokens per turn (a seeded function of the prompt, so
    both modes request the same lengths); the random model never stops on its own."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine = engine

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        n = 16 + zlib.crc32(str(prompt_ids).encode()) % 33
        return await self.engine.generate(prompt_ids, params.model_copy(update={"max_new_tokens": n}))

    def update_weights(self, policy: object) -> None:
        self.engine.update_weights(policy)


def workload(quick: bool, latency_scale: float = 1.0) -> tuple[LatencyOptions, RolloutLimits, int]:
    scale = (0.5 if quick else 1.0) * latency_scale
    options = LatencyOptions(
        min_turns=2,
        max_turns=8,
        init_mean_s=1.0 * scale,
        init_sigma=0.5,
        step_mean_s=0.2 * scale,
        step_sigma=1.0,
        eval_mean_s=2.0 * scale,
        eval_sigma=0.5,
    )
    caps = 16 if quick else 32
    return options, RolloutLimits.uniform(caps), (16 if quick else 32)


def make_agent(caps: int) -> tuple[Agent, HFEngine]:
    model, tokenizer = tiny_random_model(seed=0)
    engine = HFEngine(model, tokenizer, max_batch_size=caps, seed=0)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=48)
    agent = Agent(
        tokenizer, VaryingLengthEngine(engine), sampling, AgentConfig(max_turns=16, max_total_tokens=4096)
    )
    return agent, engine


async def warm_up(engine: HFEngine) -> None:
    await asyncio.gather(
        *(engine.generate([1, 2, 3, 4 + i], SamplingParams(max_new_tokens=4)) for i in range(4))
    )


def timed(mode: str, agent: Agent, options: LatencyOptions, limits: RolloutLimits, n_tasks: int, **kw):
    tasks = LatencyEnv.make_tasks("train", n_tasks, 0, options)
    runner = run_pipeline if mode == "pipeline" else run_lockstep
    start = time.perf_counter()
    result = asyncio.run(runner(agent, LatencyEnv.factory(options), make_jobs(tasks, GROUP), limits, **kw))
    return time.perf_counter() - start, result


def child(quick: bool, n_tasks: int) -> None:
    """One pipeline run that keeps no records in memory; prints its peak resident memory."""
    options, limits, _ = workload(quick, latency_scale=0.1)
    agent, engine = make_agent(limits.run_slots)
    asyncio.run(warm_up(engine))
    with tempfile.TemporaryFile("w") as sink:
        wall, result = timed(
            "pipeline",
            agent,
            options,
            limits,
            n_tasks,
            collect=False,
            on_trajectory=lambda t: sink.write(t.to_json() + "\n"),
        )
    print(f"trajectories={n_tasks * GROUP} failed={int(result.metrics['rollout/failed'])} wall_s={wall:.1f}")
    print(f"peak_rss_mib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f}")


def shuffled(n: int, seed: int) -> list[int]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def peak_rss_mib(quick: bool, task_counts: list[int]) -> list[float]:
    """Peak resident memory of one fresh pipeline process per task count (run side by side: each
    process measures only its own peak)."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child-tasks", str(n)]
            + (["--quick"] if quick else []),
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in task_counts
    ]
    peaks = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"memory probe failed (exit {proc.returncode})")
        line = next(s for s in out.splitlines() if s.startswith("peak_rss_mib="))
        peaks.append(float(line.split("=", 1)[1]))
    return peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 tasks x 4, limits of 16, latencies halved")
    parser.add_argument("--child-tasks", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_tasks is not None:
        child(args.quick, args.child_tasks)
        return

    options, limits, n_tasks = workload(args.quick)
    agent, engine = make_agent(limits.run_slots)
    asyncio.run(warm_up(engine))
    lockstep_s, lock = timed("lockstep", agent, options, limits, n_tasks)
    pipeline_s, pipe = timed("pipeline", agent, options, limits, n_tasks)
    durations = [StageDurations(t.timings.init_s, t.timings.run_s, t.timings.eval_s) for t in pipe]
    longest = max(d.total_s for d in durations)
    packed = sum(d.run_s for d in durations) / limits.run_slots
    ideal_s = lower_bound_s(durations, limits.run_slots)
    replay_fifo = replay_makespan(durations, range(len(durations)), limits)
    replay_lpt = replay_makespan(durations, longest_first(durations), limits)
    random_eff = [
        ideal_s / replay_makespan(durations, shuffled(len(durations), seed), limits) for seed in range(200)
    ]
    base_tasks = 1 if args.quick else n_tasks  # the quick memory probe: 4 vs 40 trajectories
    rss_1x, rss_10x = peak_rss_mib(args.quick, [base_tasks, base_tasks * 10])

    print(f"trajectories={len(pipe)} group_size={GROUP} run_slots={limits.run_slots}")
    print(f"failed_lockstep={int(lock.metrics['rollout/failed'])}")
    print(f"failed_pipeline={int(pipe.metrics['rollout/failed'])}")
    print(f"mean_turns={sum(t.num_turns for t in pipe) / len(pipe):.2f}")
    print(f"engine_mean_batch_size={engine.stats['mean_batch_size']:.1f}")
    print(f"pipeline_running_mean={pipe.metrics['rollout/running_mean']:.1f}")
    print(f"lockstep_s={lockstep_s:.1f}")
    print(f"pipeline_s={pipeline_s:.1f}")
    print(f"ideal_s={ideal_s:.1f} (longest_trajectory_s={longest:.1f} packed_run_s={packed:.1f})")
    print(f"efficiency={ideal_s / pipeline_s:.3f}")
    print(f"replay_job_order_s={replay_fifo:.1f} (efficiency {ideal_s / replay_fifo:.3f})")
    print(f"replay_longest_first_s={replay_lpt:.1f} (efficiency {ideal_s / replay_lpt:.3f}, clairvoyant)")
    print(
        f"replay_random_orders=200 (mean efficiency {sum(random_eff) / len(random_eff):.3f}, "
        f"{sum(e >= 0.8 for e in random_eff) / len(random_eff):.0%} reach 0.8)"
    )
    print(f"peak_rss_mib_1x={rss_1x:.0f} ({base_tasks} tasks)")
    print(f"peak_rss_mib_10x={rss_10x:.0f} ({base_tasks * 10} tasks)")
    print(f"peak_rss_growth={(rss_10x - rss_1x) / rss_1x:.3f}")
    print(f"speedup={lockstep_s / pipeline_s:.2f}")


if __name__ == "__main__":
    main()
