"""How many lessons does the extractor role put in the experience pool? The extractor of a recipe on
finished trajectories, asked exactly as a training run with ``experience.enabled`` asks it.

Reads trajectory JSONL files of the recipe's env and groups them by task (the samples of one task
are the group a run shows its extractor: a success beside a failure where the group has both),
hands up to ``--groups`` groups to :meth:`horizonrl.train.experience.ExperienceStage.extract` with
the extractor role of ``--config`` (``roles.extractor``; the config's model by default, or any
endpoint the roles block names; ``roles.extractor.structured=parse`` reads free text instead of
holding the reply to the schema), into an empty pool, and prints ``name=value`` lines: replies,
replies that were not the structured object (their text was read by the free-text parser), lessons
dropped by reason, lessons added to the pool and near-duplicates, the extractor's time and tokens,
and the lessons that entered the pool. Writes everything to ``--out`` as JSON.

    python benchmarks/experience_extraction.py --config configs/calc.yaml data/mast/trajectories.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from horizonrl.config import load_config
from horizonrl.roles import Roles
from horizonrl.train.experience import ExperienceStage
from horizonrl.train.runtime import build_runtime
from horizonrl.types import read_trajectories


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trajectories", nargs="+", type=Path, help="trajectory JSONL files")
    parser.add_argument("--config", type=Path, required=True, help="the recipe: env, experience, roles")
    parser.add_argument("--groups", type=int, default=20, help="tasks whose samples the extractor is shown")
    parser.add_argument(
        "--out", type=Path, default=None, help="where the JSON goes (default: beside the first file)"
    )
    parser.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    config = load_config(args.config, args.overrides)
    cfg = config.experience.model_copy(update={"extract_per_step": args.groups})
    env = config.env.name
    trajectories = [
        # one group per task, as a run's group of samples of one task
        t.model_copy(update={"group_id": t.task_id})
        for path in args.trajectories
        for t in read_trajectories(path)
        if t.env == env
    ]
    if not trajectories:
        print(f"no trajectory of env {env!r} in {args.trajectories}", file=sys.stderr)
        return 2

    runtime = build_runtime(config) if config.roles.for_role("extractor").backend == "policy" else None
    roles = Roles(config.roles, runtime.engine if runtime else None, runtime.tokenizer if runtime else None)
    from horizonrl.envs.registry import make_env, parse_env_options

    tools = [t.name for t in make_env(env, parse_env_options(env, config.env.options)).tools] or None
    stage = ExperienceStage(cfg, roles.get("extractor"), runtime.tokenizer if runtime else None, tools)

    t0 = time.perf_counter()
    try:
        counts = asyncio.run(stage.extract(trajectories, step=1))
    finally:
        if runtime is not None:
            runtime.close()
    extract_s = time.perf_counter() - t0

    lessons = [{"when_to_use": e.when_to_use, "content": e.content} for e in stage.pool.items]
    usage = roles.usage().get("extractor")
    result = {
        "env": env,
        "config": str(args.config),
        "extractor_role": roles.describe()["extractor"].replace("the run's policy", str(config.model.path)),
        "extractor_structured": config.roles.for_role("extractor").structured,
        "files": [str(p) for p in args.trajectories],
        "counts": {k.removeprefix("experience/"): v for k, v in counts.items()},
        "extract_s": round(extract_s, 1),
        "extractor_usage": usage,
        "lessons": lessons,
    }
    out = args.out or args.trajectories[0].with_suffix(".experience_extraction.json")
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")

    c = result["counts"]
    replies = int(c["extraction_groups"])
    dropped = {k.removeprefix("dropped_"): int(v) for k, v in c.items() if k.startswith("dropped_")}
    lines = {
        "env": env,
        "extractor_role": result["extractor_role"],
        "extractor_structured": result["extractor_structured"],
        "replies": replies,
        "replies_unstructured": f"{int(c.get('unstructured', 0))}/{replies}",
        "lessons_dropped": json.dumps(dropped),
        "lessons_added": int(c.get("added", 0)),
        "lessons_duplicate": int(c.get("duplicate", 0)),
        "pool_size": int(c["pool_size"]),
        "extract_s": result["extract_s"],
        "extractor_usage": json.dumps(usage),
    }
    for key, value in lines.items():
        print(f"{key}={value}")
    for lesson in lessons[:5]:
        print(f"lesson={json.dumps(lesson)}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
