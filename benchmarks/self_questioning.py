"""Self-questioning on an API world: how many tasks the explorer and synthesizer roles produce, how
many survive validation (and why the others do not), and how varied the kept ones are.

Runs exploration then synthesis (``horizon evolve questions``' pipeline) on ``configs/flights.yaml``
with the roles its ``roles:`` block names (the policy itself by default; point ``roles.explorer``
and ``roles.synthesizer`` at a capable endpoint with KEY=VALUE overrides). Prints ``name=value``
lines — explorer turns and how many held a parsable call, calls the world accepted, candidates,
kept tasks, the share valid, drops by reason, tasks per minute, operations explored and used by
the kept tasks, ``mean_embedding_distance`` (mean pairwise cosine distance of the kept queries'
all-MiniLM-L6-v2 embeddings) and ``mean_query_distance`` (the same with word-set Jaccard) — and
writes ``runs/self_questioning/summary.json``.

    python benchmarks/self_questioning.py [--config configs/flights.yaml] [--quick] [KEY=VALUE ...]

``--quick``: one breadth probe per operation and two depth sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from pathlib import Path

from horizonrl.build import build_runtime
from horizonrl.config import load_config
from horizonrl.envs.registry import make_env, parse_env_options
from horizonrl.evolve.embed import QueryEmbedder
from horizonrl.evolve.explore import explore
from horizonrl.evolve.profile import env_profile
from horizonrl.evolve.synthesize import jaccard, synthesize
from horizonrl.roles import Roles

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "flights.yaml"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    quick = ["explore.breadth_probes=1", "explore.depth_sessions=2"] if args.quick else []
    config = load_config(args.config, [*quick, *args.overrides])
    options = parse_env_options(config.env.name, config.env.options)
    profile = env_profile(config.env.name, config.env.options)
    runtime = build_runtime(config)
    roles = Roles(config.roles, runtime.engine, runtime.tokenizer)
    embedder = QueryEmbedder() if config.explore.embedding_duplicate is not None else None

    def make() -> object:
        return make_env(config.env.name, options)

    start = time.perf_counter()
    traces = asyncio.run(explore(roles.get("explorer"), make, profile, config.explore, config.seed))
    explored = time.perf_counter() - start
    tasks, report = asyncio.run(
        synthesize(
            roles.get("synthesizer"), make, profile, traces, config.explore, config.seed, None, embedder
        )
    )
    wall = time.perf_counter() - start
    runtime.close()
    queries = [t.data["query"] for t in tasks]
    pairs = list(itertools.combinations(queries, 2))
    figures = {
        "world": config.env.name,
        "explorer": config.roles.for_role("explorer").backend,
        "synthesizer": config.roles.for_role("synthesizer").backend,
        "guided": config.explore.guided,
        "explorer_turns": sum(t.turns for t in traces),
        "parsed_turns": sum(t.turns - t.unparsed_turns for t in traces),
        **report.as_dict(),
        "explore_s": round(explored, 1),
        "wall_s": round(wall, 1),
        "tasks_per_minute": round(len(tasks) / (wall / 60), 2),
        "mean_query_distance": round(sum(1 - jaccard(a, b) for a, b in pairs) / len(pairs), 3)
        if pairs
        else None,
    }
    out = ROOT / "runs" / "self_questioning"
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    (out / "tasks.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in tasks), encoding="utf-8")
    for name, value in figures.items():
        if isinstance(value, dict):
            for key, sub in sorted(value.items()):
                print(f"{name}_{key}={sub}")
        else:
            print(f"{name}={value}")


if __name__ == "__main__":
    main()
