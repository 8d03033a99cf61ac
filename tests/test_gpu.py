"""On a CUDA GPU the policy runs where ``model.device`` says (``auto``: the GPU): a run samples and
trains there, and the policy it saves loads on a CPU as the same policy. Skipped, with the reason
printed, where PyTorch sees no CUDA GPU; the CPU side of ``model.device`` is tested in
test_hardware.py."""

from __future__ import annotations

import pytest
import torch
from builders import completions, save_base, tiny_settings
from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.config import load_config
from horizonrl.model_config import TINY_ALIAS, ModelConfig
from horizonrl.models import load_model
from horizonrl.train.run import TrainingRun

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: PyTorch sees none on this machine"
)
CALC = "configs/calc.yaml"


def _device(model) -> str:
    return next(model.parameters()).device.type


def test_auto_loads_the_policy_onto_the_gpu():
    model, _ = load_model(ModelConfig(path=TINY_ALIAS, dtype="float32"), trainable=True)
    assert _device(model) == "cuda"
    assert all(p.device.type == "cuda" for p in model.parameters() if p.requires_grad)  # the LoRA too
    cpu, _ = load_model(ModelConfig(path=TINY_ALIAS, dtype="float32", device="cpu"))
    assert _device(cpu) == "cpu"


def test_a_run_trains_on_the_gpu_and_its_policy_loads_on_the_cpu(tmp_path):
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 on both sides of the comparison
    settings = tiny_settings(save_base(tmp_path / "base0", seed=0))
    config = load_config(CALC, [*settings, "model.device=cuda", f"output_dir={tmp_path}", "name=run"])
    run = TrainingRun(config)
    summary = run.run()
    assert summary["finished"] and summary["sft"] and summary["device"] == "cuda"
    assert _device(run.policy) == "cuda" and _device(run.engine.model) == "cuda"
    run_dir = tmp_path / "run"

    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[1, 17, 42, 99, 7, 3, 250, 1000, 5, 64]])
    with torch.no_grad():
        on_gpu = run.policy.eval()(input_ids=ids.cuda()).logits.cpu()
        on_cpu = AutoModelForCausalLM.from_pretrained(run_dir / "policy", dtype=torch.float32)(
            input_ids=ids
        ).logits
    assert torch.allclose(on_cpu, on_gpu, atol=2e-3), (on_cpu - on_gpu).abs().max()

    out = tmp_path / "reloaded.jsonl"
    args = ["eval", CALC, *settings, "model.device=cpu", "--checkpoint", str(run_dir), "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    in_run = completions(run_dir / "eval" / "step_000002.jsonl")
    assert completions(out) == in_run  # greedy: the CPU samples what the GPU sampled


def test_ppo_trains_its_value_head_beside_the_policy_on_the_gpu(tmp_path):
    settings = tiny_settings(save_base(tmp_path / "base0", seed=0))
    config = load_config(
        CALC, [*settings, "train.algorithm=ppo", "train.steps=1", f"output_dir={tmp_path}", "name=ppo"]
    )
    run = TrainingRun(config)
    summary = run.run()
    assert summary["finished"] and summary["device"] == "cuda"
    head = run.modules["value_head"]
    assert next(head.parameters()).device.type == "cuda"  # it ran on the GPU's hidden states
    assert (tmp_path / "ppo" / "checkpoints" / "step_000001").is_dir()
