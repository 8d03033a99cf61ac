"""Self-questioning on an API world: how many tasks the explorer and synthesizer roles produce, how
many survive validation (and why the others do not), and how varied the kept ones are.

Runs exploration then synthesis (``horizon evolve questions``' pipeline) on ``configs/flights.yaml``
with the roles its ``roles:`` block names (the policy itself by default; point ``roles.explorer``
and ``roles.synthesizer`` at a capable endpoint with KEY=VALUE overrides). Prints ``name=value``
lines — explorer turns and how many held a parsable call (``free_text_turns``: of those, read by the
free-text parser because the structured reply was unusable; ``ROLE_unusable``: unusable structured
replies of each model role / all its structured replies), calls the world accepted, candidates,
kept tasks, the share valid, drops by reason, tasks per minute, operations explored and used by
the kept tasks, ``mean_embedding_distance`` (mean pairwise cosine distance of the kept queries'
all-MiniLM-L6-v2 embeddings), ``mean_query_distance`` (the same with word-set Jaccard) and
``sentence_as_name`` (kept tasks whose reference passes a sentence the world said, such as an error
message, where a parameter names something: a file, a user, a city) — and writes
``runs/self_questioning/summary.json``, with the kept tasks and the exploration traces beside it.
``--config configs/evolve_flights.yaml`` measures the scripted explorer and template writer that
recipe uses.

    python benchmarks/self_questioning.py [--config configs/flights.yaml] [--quick] [KEY=VALUE ...]

``--quick``: one breadth probe per operation and two depth sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from pathlib import Path

from horizonrl.config import load_config
from horizonrl.evolve.explore import exploration_task
from horizonrl.evolve.queries import jaccard
from horizonrl.evolve.questions import self_question, uses_policy
from horizonrl.evolve.walk import fitting
from horizonrl.io import write_jsonl_atomic
from horizonrl.roles import Roles
from horizonrl.train.runtime import build_runtime

ROOT = Path(__file__).resolve().parents[1]


def sentence_as_name(config, tasks) -> int:
    """Tasks whose reference passes a string the walk would not draw for its parameter (a sentence
    where the parameter names something; the schemas are the world's tools in an exploration session)."""
    from horizonrl.envs.registry import make_env, parse_env_options

    env = make_env(config.env.name, parse_env_options(config.env.name, config.env.options))
    asyncio.run(env.reset(exploration_task("probe", config.env.name, 0)))
    properties = {t.name: t.parameters.get("properties", {}) for t in env.tools}
    asyncio.run(env.close())

    def sentence(call) -> bool:
        schemas = properties.get(call["name"], {})
        return any(
            isinstance(value, str) and not fitting([value], "string", name, schemas.get(name, {}))
            for name, value in call["arguments"].items()
        )

    return sum(any(sentence(c) for c in t.data["reference_solution"]) for t in tasks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "flights.yaml"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    quick = ["explore.breadth_probes=1", "explore.depth_sessions=2"] if args.quick else []
    config = load_config(args.config, [*quick, *args.overrides])
    runtime = build_runtime(config) if uses_policy(config) else None
    engine, tokenizer = (runtime.engine, runtime.tokenizer) if runtime is not None else (None, None)
    roles = Roles(config.roles, engine, tokenizer)
    run = self_question(config, roles)
    usage = roles.usage()
    if runtime is not None:
        runtime.close()
    ex = config.explore
    queries = [t.data["query"] for t in run.tasks]
    pairs = list(itertools.combinations(queries, 2))
    figures = {
        "world": config.env.name,
        "explorer": "walk" if ex.explorer == "walk" else config.roles.for_role("explorer").backend,
        "synthesizer": "template"
        if ex.synthesizer == "template"
        else config.roles.for_role("synthesizer").backend,
        "guided": config.explore.guided,
        "explorer_turns": sum(t.turns for t in run.traces),
        "parsed_turns": sum(t.turns - t.unparsed_turns for t in run.traces),
        "free_text_turns": sum(t.free_text_turns for t in run.traces),
        **{
            f"{name}_unusable": f"{usage[name]['unusable']}/{usage[name]['structured']}"
            for name in ("explorer", "synthesizer")
            if name in usage
        },
        **run.figures(),
        "mean_query_distance": round(sum(1 - jaccard(a, b) for a, b in pairs) / len(pairs), 3)
        if pairs
        else None,
        "sentence_as_name": sentence_as_name(config, run.tasks),
    }
    if figures["mean_embedding_distance"] is None and len(queries) > 1:  # the dedup check was off
        from horizonrl.evolve.embed import QueryEmbedder, mean_pairwise_distance

        distance = mean_pairwise_distance(QueryEmbedder().embed(queries))
        figures["mean_embedding_distance"] = round(distance, 3) if distance is not None else None
    out = ROOT / "runs" / "self_questioning"
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    write_jsonl_atomic(out / "tasks.jsonl", run.tasks)
    write_jsonl_atomic(out / "traces.jsonl", run.traces)
    for name, value in figures.items():
        if isinstance(value, dict):
            for key, sub in sorted(value.items()):
                print(f"{name}_{key}={sub}")
        else:
            print(f"{name}={value}")


if __name__ == "__main__":
    main()
