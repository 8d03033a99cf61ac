"""Data-parallel training steps (``torch.distributed``, gloo): two ranks, each a real process that
trains on its share of every mini-batch, end with the weights one process reaches on the whole batch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dp_case import build, run_step

from horizonrl.data_parallel import combine_stats, my_share
from horizonrl.local_server import free_port

HERE = Path(__file__).resolve().parent


def _ranks(world: int, overrides: dict, tmp_path: Path) -> list[dict]:
    port = free_port()
    outs = [tmp_path / f"rank{r}.pt" for r in range(world)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "dp_rank.py"),
                str(r),
                str(world),
                str(port),
                str(outs[r]),
                json.dumps(overrides),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out[-3000:]
    return [torch.load(o, weights_only=False) for o in outs]


@pytest.mark.parametrize(
    "overrides",
    [
        # the demo recipe's update: Dr.GRPO, two optimizer steps per batch (old logprobs for the second)
        {"algorithm": "dr_grpo", "mini_batches": 2},
        # PPO with a critic and two epochs: the value head's gradients are summed too
        {"algorithm": "ppo", "ppo_epochs": 2, "mini_batches": 2},
        # one trajectory per mini-batch: rank 1's share is always empty and it contributes zeros
        {"algorithm": "grpo", "mini_batches": 6},
    ],
    ids=["dr_grpo", "ppo_critic", "empty_share"],
)
def test_two_ranks_reach_the_weights_of_one_process(overrides, tmp_path):
    model, head, optimizer, scheduler, cfg = build(overrides)
    alone = run_step(model, head, optimizer, scheduler, cfg, None)
    expected = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    if head is not None:
        expected.update({f"head.{n}": p.detach() for n, p in head.named_parameters()})

    rank0, rank1 = _ranks(2, overrides, tmp_path)
    # the ranks never broadcast weights: they stay identical because they step on the same gradient
    for name in expected:
        assert torch.equal(rank0["weights"][name], rank1["weights"][name]), name
    # the summed gradients equal one process's up to float summation order (and thread count)
    start = {n: p.detach().clone() for n, p in build(overrides)[0].named_parameters() if p.requires_grad}
    for name, want in expected.items():
        torch.testing.assert_close(
            rank0["weights"][name], want, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
        )
    moved = [n for n in start if not torch.equal(start[n], expected[n])]
    assert moved, "the step changed nothing: the comparison would be empty"
    for key in ("loss", "grad_norm", "trained_trajectories", "optimizer_steps"):
        assert rank0["metrics"][key] == pytest.approx(alone[key], rel=1e-4, abs=1e-6), key
        assert rank1["metrics"][key] == rank0["metrics"][key], key


def test_shares_cover_a_mini_batch_once_and_stats_merge_by_tokens():
    class Two:
        world_size = 3

        def __init__(self, rank):
            self.rank = rank

    part = [4, 8, 15, 16, 23, 42, 7]
    shares = [my_share(part, Two(r)) for r in range(3)]
    assert sorted(i for s in shares for i in s) == sorted(part)
    assert my_share(part, None) == part
    merged = combine_stats(
        [
            ({"loss": 0.5, "clip_frac": 0.2}, 30.0),
            ({"loss": 0.25, "clip_frac": 0.5}, 10.0),
            ({"loss": 0.0}, 0.0),
        ]
    )
    assert merged["loss"] == pytest.approx(0.75)
    assert merged["clip_frac"] == pytest.approx((0.2 * 30 + 0.5 * 10) / 40)
