"""The experience pool inside a training run: retrieved experiences reach round(eta*n) samples of a
task as an <EXP> block, the extractor fills the pool from finished groups, samples are stripped
before the update with the wider clip for guided ones, and the pool is saved in every checkpoint and
restored on resume — a resumed run matches an uninterrupted one.

The extractor here is a scripted role (a capable model cannot run on this machine): it answers with
one experience naming the task it was shown, as the structured reply a real role gives (that a real
engine role's replies are always that structure is tested in test_experience_pool.py).
Model, env, rollouts, trainer and checkpoints are real (the tiny random model, the toy coin env)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import toy_envs  # noqa: F401 - registers the coin env
from builders import TINY_COIN, script_role

from horizonrl.config import load_config
from horizonrl.errors import ConfigError, DataError
from horizonrl.roles.structured import parse_reply
from horizonrl.train.run import TrainingRun
from horizonrl.train.tracking import read_metrics
from horizonrl.types import read_trajectories

SETTINGS = [
    *TINY_COIN,
    "engine.dtype=float32",
    "eval.concurrency=1",
    "train.steps=3",
    "train.lr=5e-3",
    "train.save_every=1",
    "train.keep_checkpoints=10",
    "train.concurrency=1",
    "experience.enabled=true",
    "experience.eta=0.5",
    "experience.extract_per_step=2",
]


class ScriptedExtractor:
    name = "scripted-extractor"

    def __init__(self) -> None:
        self.calls = 0

    async def chat(self, messages, **sampling):
        self.calls += 1
        task = re.search(r"Task: (.*)", messages[-1].content).group(1)
        lesson = {"when_to_use": f"asked to {task.lower()}", "content": f"answer {task} briefly"}
        return json.dumps({"lessons": [lesson]})

    async def structured(self, messages, schema, **sampling):
        return parse_reply(await self.chat(messages, **sampling), schema)


@pytest.fixture
def scripted_extractor(monkeypatch):
    extractor = ScriptedExtractor()
    script_role(monkeypatch, "extractor", extractor)
    return extractor


def run(tmp_path: Path, name: str, *extra: str, resume: bool = False) -> dict:
    config = load_config("configs/calc.yaml", [*SETTINGS, *extra, f"output_dir={tmp_path}", f"name={name}"])
    return TrainingRun(config, resume=resume).run()


def test_experiences_reach_half_the_samples_and_the_pool_is_checkpointed(tmp_path, scripted_extractor):
    run(tmp_path, "exp")
    run_dir = tmp_path / "exp"
    first = read_trajectories(run_dir / "trajectories" / "step_000001.jsonl")
    assert not any("<EXP>" in m.content for t in first for m in t.messages)  # the pool starts empty
    later = read_trajectories(run_dir / "trajectories" / "step_000002.jsonl")
    by_group: dict[str, list[bool]] = {}
    for traj in later:
        by_group.setdefault(traj.group_id, []).append("<EXP>" in traj.messages[0].content)
    assert sorted(sum(v) for v in by_group.values()) == [2, 2]  # round(0.5 * 4) per task
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl") if "reward_mean" in m}
    assert metrics[1]["experience/added"] == 2 and metrics[2]["experience/guided_samples"] == 4
    assert all(metrics[k]["experience/unstructured"] == 0 for k in (1, 2, 3))
    assert metrics[2]["experience/unstrippable"] == 0
    pool = json.loads((run_dir / "checkpoints" / "step_000003" / "experience_pool.json").read_text())
    assert {e["when_to_use"] for e in pool["items"]} >= {"asked to toss 0.", "asked to toss 1."}
    assert scripted_extractor.calls == 3 * 2


def test_a_resumed_run_with_the_pool_matches_an_uninterrupted_one(tmp_path, scripted_extractor):
    run(tmp_path, "straight")
    run(tmp_path, "resumed")
    # a crash right after step 1's checkpoint: the later checkpoints never happened
    for step in (2, 3):
        shutil.rmtree(tmp_path / "resumed" / "checkpoints" / f"step_{step:06d}")
    run(tmp_path, "resumed", resume=True)
    a, b = tmp_path / "straight", tmp_path / "resumed"
    for step in (2, 3):
        ta = sorted(read_trajectories(a / "trajectories" / f"step_{step:06d}.jsonl"), key=lambda t: t.id)
        tb = sorted(read_trajectories(b / "trajectories" / f"step_{step:06d}.jsonl"), key=lambda t: t.id)
        assert [(t.id, t.messages[0].content, t.response_ids) for t in ta] == [
            (t.id, t.messages[0].content, t.response_ids) for t in tb
        ]
    pa = json.loads((a / "checkpoints" / "step_000003" / "experience_pool.json").read_text())
    pb = json.loads((b / "checkpoints" / "step_000003" / "experience_pool.json").read_text())
    assert pa["items"] == pb["items"]


def test_a_seed_file_fills_the_pool_before_the_first_step(tmp_path, scripted_extractor):
    seed = tmp_path / "seed.jsonl"
    seed.write_text(json.dumps({"when_to_use": "asked to toss a coin", "content": "say heads"}) + "\n")
    run(tmp_path, "seeded", f"experience.seed={seed}", "experience.extract_per_step=0", "train.steps=1")
    run_dir = tmp_path / "seeded"
    first = read_trajectories(run_dir / "trajectories" / "step_000001.jsonl")
    by_group: dict[str, list[bool]] = {}
    for traj in first:
        by_group.setdefault(traj.group_id, []).append("say heads" in traj.messages[0].content)
    assert sorted(sum(v) for v in by_group.values()) == [2, 2]  # round(0.5 * 4) per task, from step 1
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert metrics[0]["experience/seed_added"] == 1
    step = next(m for m in metrics if "reward_mean" in m)
    assert {"experience/guided_success", "experience/unguided_success"} <= step.keys()
    pool = json.loads((run_dir / "checkpoints" / "step_000000" / "experience_pool.json").read_text())
    assert [e["when_to_use"] for e in pool["items"]] == ["asked to toss a coin"]
    assert scripted_extractor.calls == 0


def test_a_bad_seed_file_stops_the_run_before_it_starts(tmp_path, scripted_extractor):
    seed = tmp_path / "seed.jsonl"
    seed.write_text("advice: toss well\n")
    with pytest.raises(DataError, match="line 1: expected a JSON object"):
        run(tmp_path, "bad", f"experience.seed={seed}")
    assert not (tmp_path / "bad" / "checkpoints").exists()
    with pytest.raises(ConfigError, match=r"experience.seed .* does not exist"):
        run(tmp_path, "missing", f"experience.seed={tmp_path / 'nope.jsonl'}")
