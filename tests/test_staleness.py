"""Samples are trained on only when all their turns come from one weights version, no older than
``train.max_staleness`` allows."""

from __future__ import annotations

import pytest

from horizonrl.config import load_config
from horizonrl.errors import ConfigError
from horizonrl.train.staleness import filter_stale
from horizonrl.types import Trajectory


def _traj(name: str, low: int | None, high: int | None) -> Trajectory:
    metrics = {} if low is None else {"policy_version_min": float(low), "policy_version_max": float(high)}
    return Trajectory(
        id=name,
        task_id="t",
        group_id="t",
        env="e",
        messages=[],
        prompt_ids=[1],
        finish="finished",
        metrics=metrics,
    )


def test_mixed_versions_are_never_trained_and_stale_ones_follow_the_policy():
    trajs = [
        _traj("now", 5, 5),
        _traj("lag1", 4, 4),
        _traj("lag3", 2, 2),
        _traj("mixed", 4, 5),
        _traj("scripted", None, None),
    ]
    kept, metrics = filter_stale(trajs, current=5, max_staleness=1)
    assert [t.id for t in kept] == ["now", "lag1", "scripted"]
    assert metrics == {"staleness/mixed_dropped": 1.0, "staleness/stale": 1.0, "staleness/max_lag": 3.0}
    kept, _ = filter_stale(trajs, current=5, max_staleness=0, stale="importance_weight")
    assert [t.id for t in kept] == ["now", "lag1", "lag3", "scripted"]
    kept, _ = filter_stale(trajs, current=5, max_staleness=0)
    assert [t.id for t in kept] == ["now", "scripted"]


def test_importance_weighting_stale_samples_needs_a_cap():
    with pytest.raises(ConfigError, match="tis_cap"):
        load_config("configs/calc.yaml", ["train.stale_samples=importance_weight", "train.tis_cap=null"])
    load_config("configs/calc.yaml", ["train.stale_samples=importance_weight", "train.tis_cap=2.0"])
