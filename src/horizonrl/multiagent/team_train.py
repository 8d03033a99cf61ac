"""`horizon team sft`: per-role SFT of a chat chain's team from oracle-derived demonstrations.

The canonical-solution script (:class:`~horizonrl.multiagent.team_oracle.TeamOracle`) plays the
chain on ``sft.num_demos`` problems of ``sft.split`` in real workspaces; every episode whose
hidden tests pass gives each role that acted its trajectories (its own steps trained, the other
role's turns, the phase context and the tool results masked). Each role then gets its own LoRA adapter
on the base from the one SFT stage (:func:`horizonrl.train.sft.sft_stage`), saved as a policy in
``RUN_DIR/team/adapters/<role>/``; ``multiagent.adapters.<role>=DIR`` plays it. A role the script
never needed (the tester, when every check passes) keeps the base.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from horizonrl.engine.base import SamplingParams
from horizonrl.io import write_jsonl_atomic, write_text_atomic
from horizonrl.multiagent.chain import load_chain
from horizonrl.multiagent.team import ChainEpisodeRecord, configured_team
from horizonrl.multiagent.team_oracle import TeamOracle
from horizonrl.train.run_lock import holds_run_dir
from horizonrl.types import Trajectory, write_trajectories

Status = Callable[[str], None]


def team_dir(config: Any) -> Path:
    return Path(config.run_dir) / "team"


def oracle_demos(config: Any, tokenizer: Any) -> tuple[list[ChainEpisodeRecord], dict[str, list[Trajectory]]]:
    """The scripted team's episodes on the training problems, and per role the trajectories of the
    solved ones."""
    from horizonrl.envs.factory import make_tasks

    chain = load_chain(config.multiagent.chain)
    tasks = make_tasks(config.env, config.sft.split, config.sft.num_demos, config.sft.seed)
    runner = configured_team(
        config, chain, tokenizer, SamplingParams(seed=config.seed), script=TeamOracle(chain)
    )
    gate = asyncio.Semaphore(config.rollout.concurrency)

    async def one(i: int) -> tuple[ChainEpisodeRecord, list[Trajectory]]:
        async with gate:
            return await runner.run(tasks[i], f"{tasks[i].id}/oracle")

    async def main() -> list[tuple[ChainEpisodeRecord, list[Trajectory]]]:
        return list(await asyncio.gather(*(one(i) for i in range(len(tasks)))))

    episodes = asyncio.run(main())
    per_role: dict[str, list[Trajectory]] = defaultdict(list)
    for record, trajectories in episodes:
        if record.success:
            for t in trajectories:
                per_role[str(t.role)].append(t)
    return [r for r, _ in episodes], dict(per_role)


@holds_run_dir
def run_team_sft(config: Any, status: Status | None = None) -> dict[str, Any]:
    """Demonstrations from the scripted team, then one adapter per role (see the module doc); writes
    ``team/episodes.jsonl``, ``team/sft_<role>.jsonl``, ``team/adapters/<role>/`` and
    ``team/sft_summary.json``, and returns the summary."""
    from horizonrl.models import load_base, load_tokenizer
    from horizonrl.policy import write_policy_atomic
    from horizonrl.tokens import pad_token_id
    from horizonrl.train.sft import sft_stage

    say = status or (lambda text: None)
    out = team_dir(config)
    say("running the scripted team on the training problems")
    start = time.perf_counter()
    records, demos = oracle_demos(config, load_tokenizer(config.model.path))
    write_jsonl_atomic(out / "episodes.jsonl", records)
    summary: dict[str, Any] = {
        "chain": config.multiagent.chain,
        "problems": len(records),
        "solved_by_script": sum(r.success for r in records),
        "demos_s": time.perf_counter() - start,
        "roles": {},
    }
    for role, trajectories in sorted(demos.items()):
        write_trajectories(out / f"sft_{role}.jsonl", trajectories)
        say(f"{role}: SFT on {len(trajectories)} demonstrations")
        loaded = load_base(config.model)
        began = time.perf_counter()
        model, history = sft_stage(
            loaded.base,
            config.model,
            trajectories,
            config.sft,
            int(pad_token_id(loaded.tokenizer)),
            seed=config.seed,
            autocast_dtype=config.train.autocast_dtype,
        )
        folder = out / "adapters" / role
        write_policy_atomic(
            folder,
            model=model,
            tokenizer=loaded.tokenizer,
            base=loaded.identity,
            name=f"team_{role}",
            description=f"{config.multiagent.chain} {role}: SFT on oracle-derived demonstrations",
        )
        summary["roles"][role] = {
            "demos": len(trajectories),
            "tokens_trained": sum(sum(t.loss_mask) for t in trajectories),
            "first_nll": history[0]["nll"] if history else None,
            "final_nll": history[-1]["nll"] if history else None,
            "train_s": time.perf_counter() - began,
            "adapter": str(folder),
        }
        del model, loaded
    write_text_atomic(out / "sft_summary.json", json.dumps(summary, indent=2) + "\n")
    return summary
