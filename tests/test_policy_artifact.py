"""The trained policy is the artifact: a run (tiny random model, SFT then two RL steps) saves a
policy that ``horizon eval --checkpoint``, plain transformers and plain peft load as exactly the
policy the run measured; what users pass as --checkpoint resolves or is refused in one line; an
adapter that does not fit its base is an error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from builders import completions, save_base, tiny_settings
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.config import load_config
from horizonrl.errors import CheckpointError, ModelLoadError
from horizonrl.models import load_policy
from horizonrl.policy import AdapterStage, concat_lora, read_manifest
from horizonrl.train.checkpoint import resolve_policy
from horizonrl.train.run import TrainingRun

CALC = "configs/calc.yaml"
runner = CliRunner()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished run: SFT, then two RL steps; returns (run, settings, the TrainingRun object)."""
    root = tmp_path_factory.mktemp("artifact")
    settings = tiny_settings(save_base(root / "base0", seed=0))
    config = load_config(CALC, [*settings, f"output_dir={root}", "name=run"])
    run = TrainingRun(config)
    summary = run.run()
    assert summary["finished"] and summary["sft"]
    return root / "run", settings, run


class Outcome:
    """A CLI result with its output's lines joined (the console wraps long lines)."""

    def __init__(self, result) -> None:
        self.exit_code = result.exit_code
        self.output = " ".join(result.output.split())


def eval_cli(settings: list[str], checkpoint: Path | str, out: Path, *extra: str) -> Outcome:
    args = ["eval", CALC, *settings, *extra, "--checkpoint", str(checkpoint), "--out", str(out)]
    return Outcome(runner.invoke(app, args))


# ---------------------------------------------------------------------------------------------------
# the form


def test_concatenated_lora_has_the_sum_of_the_stages_deltas():
    torch.manual_seed(0)
    key = "base_model.model.layers.0.q_proj"
    other = "base_model.model.layers.0.up_proj"
    first = AdapterStage(
        "sft",
        {
            f"{key}.lora_A.weight": torch.randn(4, 8),
            f"{key}.lora_B.weight": torch.randn(6, 4),
            f"{other}.lora_A.weight": torch.randn(4, 8),
            f"{other}.lora_B.weight": torch.randn(5, 4),
        },
        {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "up_proj"]},
    )
    second = AdapterStage(  # another rank and scaling, and it does not adapt up_proj
        "rl",
        {f"{key}.lora_A.weight": torch.randn(2, 8), f"{key}.lora_B.weight": torch.randn(6, 2)},
        {"r": 2, "lora_alpha": 6, "target_modules": ["q_proj"]},
    )
    both = concat_lora([first, second])
    assert both.config["r"] == 6 and both.config["lora_alpha"] == 6  # scaling 1
    assert both.config["target_modules"] == ["q_proj", "up_proj"]

    def delta(stage: AdapterStage, prefix: str) -> torch.Tensor:
        a, b = stage.weights.get(f"{prefix}.lora_A.weight"), stage.weights.get(f"{prefix}.lora_B.weight")
        if a is None:
            return torch.zeros(())
        return b @ a * stage.config["lora_alpha"] / stage.config["r"]

    for prefix in (key, other):
        assert torch.allclose(delta(both, prefix), delta(first, prefix) + delta(second, prefix), atol=1e-5)


def test_the_run_saves_a_policy_that_says_what_it_is(trained):
    run_dir, _, _ = trained
    policy = run_dir / "policy"
    manifest = read_manifest(policy)
    assert manifest.kind == "lora" and manifest.stages == ["stages/00_sft", "stages/01_rl"]
    assert manifest.base.path.endswith("base0") and len(manifest.base.fingerprint) == 64
    config = json.loads((policy / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == manifest.base.resolved  # its real base
    assert config["r"] == 32  # the SFT and RL adapters (rank 16 each) concatenated
    assert (policy / "tokenizer_config.json").is_file()
    stage_base = json.loads((policy / "stages/01_rl/adapter_config.json").read_text())[
        "base_model_name_or_path"
    ]
    assert stage_base.startswith("horizonrl-stack(")  # the RL adapter's base is no model on disk
    last = run_dir / "checkpoints" / "step_000002" / "policy"
    assert (last / "adapter_model.safetensors").read_bytes() == (
        policy / "adapter_model.safetensors"
    ).read_bytes()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["policy"] == str(policy)


# ---------------------------------------------------------------------------------------------------
# (a) the in-run eval and `horizon eval --checkpoint` agree


@pytest.mark.parametrize("which", ["run", "checkpoints/step_000002", "policy"])
def test_eval_of_the_saved_policy_repeats_the_runs_own_eval(trained, tmp_path, which):
    run_dir, settings, _ = trained
    out = tmp_path / "reloaded.jsonl"
    result = eval_cli(settings, run_dir if which == "run" else run_dir / which, out)
    assert result.exit_code == 0, result.output
    in_run = completions(run_dir / "eval" / "step_000002.jsonl")
    assert completions(out) == in_run
    # and RL trained an adapter of its own on top of SFT's
    rl = load_file(run_dir / "policy" / "stages" / "01_rl" / "adapter_model.safetensors")
    assert max(float(v.abs().max()) for k, v in rl.items() if "lora_B" in k) > 1e-3


# ---------------------------------------------------------------------------------------------------
# (b) plain transformers and peft load the same logits


def _ids() -> torch.Tensor:
    return torch.tensor([[1, 17, 42, 99, 7, 3, 250, 1000, 5, 64]])


def test_plain_transformers_and_peft_load_the_trainers_policy(trained):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir, _, run = trained
    with torch.no_grad():
        want = run.policy.eval()(input_ids=_ids().to(run.policy.device)).logits.cpu()  # CPU or GPU
        via_transformers = AutoModelForCausalLM.from_pretrained(run_dir / "policy", dtype=torch.float32)
        got_transformers = via_transformers(input_ids=_ids()).logits
        manifest = read_manifest(run_dir / "policy")
        base = AutoModelForCausalLM.from_pretrained(manifest.base.resolved, dtype=torch.float32)
        untrained = base(input_ids=_ids()).logits
        via_peft = PeftModel.from_pretrained(base, run_dir / "policy")
        got_peft = via_peft(input_ids=_ids()).logits
    # float32 noise: merged weights (W + BA) round differently from the adapter applied on the fly, and
    # the models are separate instances whose matmuls may split the work differently (1.0e-4 apart
    # with single-threaded matmuls); a wrong or missing stage moves the logits by > 1e-2 (below)
    assert torch.allclose(got_transformers, want, atol=5e-4), (got_transformers - want).abs().max()
    assert torch.allclose(got_peft, want, atol=5e-4), (got_peft - want).abs().max()
    assert (untrained - want).abs().max() > 1e-2  # the trained policy is not the base


# ---------------------------------------------------------------------------------------------------
# (c) an adapter that does not fit its base is refused


def test_a_policy_loaded_on_another_base_is_refused(trained, tmp_path):
    run_dir, settings, _ = trained
    other = save_base(tmp_path / "base1", seed=1)  # same shapes, other weights
    swapped = [s if not s.startswith("model.path=") else f"model.path={other}" for s in settings]
    out = tmp_path / "out.jsonl"
    result = eval_cli(swapped, run_dir, out)
    assert result.exit_code == 2
    assert "different model" in result.output and "same shape, other weights" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_an_adapter_with_keys_that_fit_no_layer_is_refused(trained, tmp_path):
    run_dir, settings, _ = trained
    foreign = tmp_path / "foreign"
    shutil.copytree(run_dir / "sft_adapter", foreign)
    (foreign / "horizonrl_policy.json").unlink()  # a plain PEFT adapter from elsewhere
    weights = load_file(foreign / "adapter_model.safetensors")
    renamed = {k.replace(".layers.", ".blocks."): v for k, v in weights.items()}
    save_file(renamed, foreign / "adapter_model.safetensors")
    config = load_config(CALC, settings)
    with pytest.raises(ModelLoadError, match="fit no layer") as err:
        load_policy(config.model, foreign).model()
    assert "missing" in str(err.value)


@pytest.mark.parametrize("with_manifest", [True, False], ids=["policy", "plain-adapter"])
def test_a_truncated_adapter_is_refused(trained, tmp_path, with_manifest):
    run_dir, settings, _ = trained
    broken = tmp_path / "broken"
    shutil.copytree(run_dir / "sft_adapter", broken)
    if not with_manifest:
        (broken / "horizonrl_policy.json").unlink()
    data = (broken / "adapter_model.safetensors").read_bytes()
    (broken / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    out = tmp_path / "out.jsonl"
    result = eval_cli(settings, broken, out)
    assert result.exit_code == 2 and "adapter_model.safetensors" in result.output, result.output
    assert ("truncated" if with_manifest else "unreadable") in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_an_adapter_of_another_architecture_is_refused(trained, tmp_path):
    run_dir, settings, _ = trained
    foreign = tmp_path / "wide"
    shutil.copytree(run_dir / "sft_adapter", foreign)
    (foreign / "horizonrl_policy.json").unlink()
    weights = load_file(foreign / "adapter_model.safetensors")
    wider = {k: torch.zeros(v.shape[0], v.shape[1] * 2) if "lora_A" in k else v for k, v in weights.items()}
    save_file(wider, foreign / "adapter_model.safetensors")
    result = eval_cli(settings, foreign, tmp_path / "out.jsonl")
    assert result.exit_code == 2 and "does not load onto this base" in result.output


def test_one_stage_of_a_policy_alone_is_refused(trained, tmp_path):
    run_dir, settings, _ = trained
    result = eval_cli(settings, run_dir / "policy" / "stages" / "01_rl", tmp_path / "out.jsonl")
    assert result.exit_code == 2 and "one stage of a policy" in result.output


# ---------------------------------------------------------------------------------------------------
# what --checkpoint accepts


def test_checkpoint_paths_resolve_to_the_policy(trained):
    run_dir, _, _ = trained
    assert resolve_policy(run_dir) == run_dir / "policy"
    assert (
        resolve_policy(run_dir / "checkpoints" / "step_000001") == run_dir / "checkpoints/step_000001/policy"
    )
    assert resolve_policy(run_dir / "policy") == run_dir / "policy"
    assert resolve_policy(run_dir / "sft_adapter") == run_dir / "sft_adapter"


def test_a_stopped_run_without_policy_resolves_to_its_latest_checkpoint(trained, tmp_path):
    run_dir, _, _ = trained
    stopped = tmp_path / "stopped"
    shutil.copytree(run_dir, stopped)
    shutil.rmtree(stopped / "policy")
    assert resolve_policy(stopped) == stopped / "checkpoints" / "step_000002" / "policy"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: (p / "file.txt").write_text("x") and p / "file.txt", "is a file"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "an empty directory"),
        (
            lambda p: (p / "other").mkdir() or ((p / "other" / "notes.md").write_text("x") and p / "other"),
            "notes.md",
        ),
        (lambda p: (p / "run" / "checkpoints").mkdir(parents=True) or p / "run", "no finished checkpoint"),
    ],
    ids=["missing", "file", "empty", "stranger", "run-without-checkpoints"],
)
def test_anything_else_is_one_error_naming_what_is_accepted(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(CheckpointError, match=message) as err:
        resolve_policy(path)
    assert "accepted" in str(err.value) or "no finished checkpoint" in str(err.value)
    result = runner.invoke(app, ["eval", CALC, "model.path=tiny-random", "--checkpoint", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_a_corrupt_checkpoint_is_named(trained, tmp_path):
    run_dir, settings, _ = trained
    copy = tmp_path / "step_000002"
    shutil.copytree(run_dir / "checkpoints" / "step_000002", copy)
    weights = copy / "policy" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    result = eval_cli(settings, copy, tmp_path / "out.jsonl")
    assert result.exit_code == 2 and "corrupt" in result.output
