"""End to end with the real embedded SmolLM2-135M-Instruct: a rollout through the CLI writes
records whose model-token logprobs match a teacher-forced recomputation by the same model, which
proves prompt_ids + response_ids is exactly the sequence sampled (no re-tokenization drift)."""

import pytest
import torch

from horizonrl.cli import app
from horizonrl.models import ModelConfig, load_model
from horizonrl.types import read_trajectories

pytestmark = pytest.mark.slow


def test_rollout_with_real_smollm2_records_the_sampled_tokens(tmp_path):
    from typer.testing import CliRunner

    out = tmp_path / "r.jsonl"
    overrides = [
        "agent.max_turns=2",
        "sampling.max_new_tokens=24",
        "sampling.temperature=1.0",
        "rollout.concurrency=2",
    ]
    result = CliRunner().invoke(
        app, ["rollout", "configs/calc.yaml", *overrides, "--n", "2", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    trajs = read_trajectories(out)
    assert len(trajs) == 2
    model, _ = load_model(ModelConfig())
    for traj in trajs:
        assert traj.num_turns >= 1 and sum(traj.loss_mask) > 0
        seq = torch.tensor([traj.prompt_ids + traj.response_ids])
        with torch.inference_mode():
            logits = model(seq).logits[0].float()
        start = len(traj.prompt_ids)
        logp = torch.log_softmax(logits[start - 1 : -1], dim=-1)  # sampled at temperature 1.0
        recomputed = logp.gather(1, torch.tensor(traj.response_ids)[:, None])[:, 0]
        mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
        recorded = torch.tensor(traj.logprobs)
        assert torch.allclose(recomputed[mask], recorded[mask], atol=2e-3), (
            (recomputed[mask] - recorded[mask]).abs().max()
        )
        assert (recorded[~mask] == 0).all()
