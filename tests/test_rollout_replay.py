"""The replay model of the pipeline's scheduling rules, against makespans computed by hand.

The model is a benchmark tool (``benchmarks/replay.py``, used by ``benchmarks/rollout_pipeline.py``),
not part of the package; the benchmarks directory is on ``sys.path`` only while it is imported."""

import importlib.util
import sys
from pathlib import Path

import pytest

from horizonrl.rollout.base import RolloutLimits

BENCHMARKS = str(Path(__file__).resolve().parents[1] / "benchmarks")
sys.path.insert(0, BENCHMARKS)
try:
    from replay import StageDurations, longest_first, lower_bound_s, replay_makespan
finally:
    sys.path.remove(BENCHMARKS)


def test_the_replay_model_lives_in_benchmarks_not_in_the_package() -> None:
    assert Path(sys.modules[replay_makespan.__module__].__file__ or "").parent == Path(BENCHMARKS)
    assert importlib.util.find_spec("horizonrl.rollout.replay") is None


def limits(run_slots: int, init_workers: int, eval_workers: int, queue_size: int) -> RolloutLimits:
    return RolloutLimits(
        run_slots=run_slots, init_workers=init_workers, eval_workers=eval_workers, queue_size=queue_size
    )


def test_longest_first_beats_job_order_on_the_classic_two_slot_case() -> None:
    jobs = [StageDurations(0, 2, 0), StageDurations(0, 2, 0), StageDurations(0, 3, 0)]
    caps = limits(2, 2, 2, 1)
    # job order: slot 1 runs 0 then 2 (0-2, 2-5), slot 2 runs 1 (0-2): 5
    assert replay_makespan(jobs, [0, 1, 2], caps) == 5
    # longest first: 2 (0-3) | 0 (0-2) then 1 (2-4): 4
    assert longest_first(jobs) == [2, 0, 1]
    assert replay_makespan(jobs, longest_first(jobs), caps) == 4
    assert lower_bound_s(jobs, 2) == pytest.approx(3.5)


def test_admission_holds_inits_back_until_a_running_episode_finishes() -> None:
    jobs = [StageDurations(10, 1, 0)] * 3
    # admission = 1 slot + queue 1 = 2: job 2 starts its init only when job 0's run ends (t=11),
    # so it runs 21-22
    assert replay_makespan(jobs, [0, 1, 2], limits(1, 3, 1, 1)) == 22
    # a queue of 5 admits all three at once: inits 0-10, runs 10-11, 11-12, 12-13
    assert replay_makespan(jobs, [0, 1, 2], limits(1, 3, 1, 5)) == 13


def test_eval_workers_queue_finished_runs_in_order() -> None:
    jobs = [StageDurations(0, 1, 3), StageDurations(0, 1, 3)]
    # both runs end at 1; one eval worker: evals 1-4 and 4-7
    assert replay_makespan(jobs, [0, 1], limits(2, 2, 1, 2)) == 7


def test_order_must_be_a_permutation_of_the_jobs() -> None:
    with pytest.raises(ValueError, match="permutation of the 2 job indices"):
        replay_makespan([StageDurations(0, 1, 0)] * 2, [0, 0], limits(1, 1, 1, 1))
