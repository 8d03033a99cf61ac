"""Training checkpoints: atomic save, round trips (LoRA and full), pruning, integrity and mismatch errors."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from horizonrl.errors import CheckpointError
from horizonrl.io import HOST
from horizonrl.model_config import LoraSettings
from horizonrl.models import tiny_random_model
from horizonrl.train.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_training_state,
    policy_dir,
    save_checkpoint,
    verify_checkpoint,
)
from horizonrl.trainable import wrap_lora

IDS = torch.tensor([[1, 17, 42, 99, 7, 3]])


def _lora(r: int = 4):
    model, _ = tiny_random_model(seed=0)
    return wrap_lora(model, LoraSettings(r=r))


def _train_step(model, optimizer) -> None:
    model.train()
    loss = model(input_ids=IDS, labels=IDS).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def _adamw(model) -> torch.optim.AdamW:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)


def _trainable(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _exp_avgs(optimizer) -> list[torch.Tensor]:
    return [optimizer.state[p]["exp_avg"].clone() for g in optimizer.param_groups for p in g["params"]]


@pytest.fixture
def trained():
    """A LoRA model and its AdamW after two real optimizer steps."""
    model = _lora()
    optimizer = _adamw(model)
    _train_step(model, optimizer)
    _train_step(model, optimizer)
    return model, optimizer


def test_lora_round_trip_restores_everything(tmp_path, trained):
    model, optimizer = trained
    path = save_checkpoint(tmp_path, 10, model, optimizer, {"step": 10, "best_success": 0.5})
    assert path == tmp_path / "checkpoints" / "step_000010"
    manifest = verify_checkpoint(path)
    assert manifest["step"] == 10 and manifest["kind"] == "adapter" and manifest["format"] == 2
    assert "policy/adapter_model.safetensors" in manifest["files"] and "optimizer.pt" in manifest["files"]
    assert "manifest.json" not in manifest["files"]
    assert (policy_dir(path) / "adapter_config.json").is_file()
    assert not (policy_dir(path) / "model.safetensors").exists()  # adapter only
    expected_rand = (torch.rand(4), random.random(), np.random.rand())
    saved_weights, saved_avgs = _trainable(model), _exp_avgs(optimizer)

    # The run goes on: weights, optimizer and RNGs move away from the saved state.
    _train_step(model, optimizer)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(1.0)
    torch.rand(10), random.random(), np.random.rand()

    state = load_training_state(path, optimizer, model)
    assert state == {"step": 10, "best_success": 0.5}
    assert torch.equal(torch.rand(4), expected_rand[0])
    assert (random.random(), np.random.rand()) == expected_rand[1:]
    for name, value in _trainable(model).items():
        assert torch.equal(value, saved_weights[name]), name
    for got, want in zip(_exp_avgs(optimizer), saved_avgs, strict=True):
        assert torch.equal(got, want)

    # A fresh process: a new model (fresh adapters) and an empty optimizer.
    fresh = _lora()
    fresh_opt = _adamw(fresh)
    assert load_training_state(path, fresh_opt, fresh)["step"] == 10
    assert all(torch.equal(v, saved_weights[n]) for n, v in _trainable(fresh).items())
    assert all(torch.equal(a, b) for a, b in zip(_exp_avgs(fresh_opt), saved_avgs, strict=True))
    _train_step(fresh, fresh_opt)  # the restored optimizer keeps working


def test_full_model_round_trip(tmp_path):
    model, _ = tiny_random_model(seed=1)
    optimizer = _adamw(model)
    _train_step(model, optimizer)
    path = save_checkpoint(tmp_path, 3, model, optimizer, {"epoch": 1})
    assert verify_checkpoint(path)["kind"] == "full"
    assert (policy_dir(path) / "model.safetensors").is_file()
    saved_weights, saved_avgs = _trainable(model), _exp_avgs(optimizer)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(0.5)  # also moves the tied lm_head
        model.model.layers[0].mlp.up_proj.weight.zero_()
    _train_step(model, optimizer)

    assert load_training_state(path, optimizer, model) == {"epoch": 1, "step": 3}
    for name, value in _trainable(model).items():
        assert torch.equal(value, saved_weights[name]), name
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert all(torch.equal(a, b) for a, b in zip(_exp_avgs(optimizer), saved_avgs, strict=True))


def test_keep_last_prunes_older_and_resave_replaces(tmp_path, trained):
    model, optimizer = trained
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, model, optimizer, {}, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000004", "step_000005"]
    save_checkpoint(tmp_path, 4, model, optimizer, {"note": "again"}, keep_last=None)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000004", "step_000005"]
    state_file = tmp_path / "checkpoints" / "step_000004" / "trainer_state.json"
    assert json.loads(state_file.read_text())["note"] == "again"
    save_checkpoint(tmp_path, 6, model, optimizer, {}, keep_last=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000006"]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_000006"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000006"]
    with pytest.raises(ValueError, match="trainer_state"):
        save_checkpoint(tmp_path, 7, model, optimizer, {"step": 8})


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_interrupted_saves_are_ignored_and_cleaned(tmp_path, trained):
    model, optimizer = trained
    assert latest_checkpoint(tmp_path) is None and list_checkpoints(tmp_path) == []
    good = save_checkpoint(tmp_path, 10, model, optimizer, {})
    root = tmp_path / "checkpoints"
    leftover = root / f".step_000020.tmp-{_dead_pid()}@{HOST}"
    old_style = root / f".step_000021.tmp-{_dead_pid()}"  # as earlier versions named it
    deleting = root / f".step_000009.del-{_dead_pid()}@{HOST}"
    for folder in (leftover, old_style, deleting):
        (folder / "policy").mkdir(parents=True)
        (folder / "optimizer.pt").write_bytes(b"partial")
    unfinished = root / "step_000030"
    unfinished.mkdir()
    (unfinished / "optimizer.pt").write_bytes(b"partial")
    assert latest_checkpoint(tmp_path) == good
    with pytest.raises(CheckpointError, match="not a finished checkpoint"):
        verify_checkpoint(unfinished)
    save_checkpoint(tmp_path, 11, model, optimizer, {})
    assert not leftover.exists() and not old_style.exists() and not deleting.exists()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000010", "step_000011"]


def test_a_live_writers_save_in_progress_is_never_removed(tmp_path, trained):
    """Two processes saving into one run (which the run lock prevents, but a stray one may): the
    other's half-written checkpoint is kept while it runs, and removed once it is dead."""
    model, optimizer = trained
    root = tmp_path / "checkpoints"
    writer = subprocess.Popen(["sleep", "600"])
    try:
        in_progress = root / f".step_000020.tmp-{writer.pid}@{HOST}"
        elsewhere = root / f".step_000020.tmp-{_dead_pid()}@another-host"  # cannot be checked: kept
        for folder in (in_progress, elsewhere):
            (folder / "policy").mkdir(parents=True)
            (folder / "optimizer.pt").write_bytes(b"being written")
        save_checkpoint(tmp_path, 10, model, optimizer, {})
        assert (in_progress / "optimizer.pt").read_bytes() == b"being written"
        assert elsewhere.is_dir()
    finally:
        writer.kill()
        writer.wait()
    save_checkpoint(tmp_path, 11, model, optimizer, {})
    assert not in_progress.exists() and elsewhere.is_dir()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000010", "step_000011"]


def test_corrupt_or_missing_files_are_reported(tmp_path, trained):
    model, optimizer = trained
    path = save_checkpoint(tmp_path, 10, model, optimizer, {})
    weights = policy_dir(path) / "adapter_model.safetensors"
    original = weights.read_bytes()
    data = bytearray(original)
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"adapter_model\.safetensors is corrupt"):
        verify_checkpoint(path)
    with pytest.raises(CheckpointError, match="corrupt"):
        load_training_state(path, optimizer, model)
    weights.write_bytes(original)
    verify_checkpoint(path)

    (path / "rng.pt").unlink()
    with pytest.raises(CheckpointError, match=r"rng\.pt is missing"):
        verify_checkpoint(path)
    (path / "manifest.json").write_text('{"format": 1, "st')
    with pytest.raises(CheckpointError, match=r"no manifest\.json"):
        verify_checkpoint(path)
    (path / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="interrupted while saving"):
        load_training_state(path, optimizer)
    with pytest.raises(CheckpointError, match="does not exist"):
        verify_checkpoint(tmp_path / "checkpoints" / "step_000099")


def test_optimizer_and_model_mismatch_is_reported(tmp_path, trained):
    model, optimizer = trained
    path = save_checkpoint(tmp_path, 10, model, optimizer, {})
    params = [p for p in model.parameters() if p.requires_grad]
    fewer = torch.optim.AdamW(params[:2], lr=1e-2)
    with pytest.raises(CheckpointError, match="has 28 parameter tensors in group 0, this run has 2"):
        load_training_state(path, fewer)
    two_groups = torch.optim.AdamW([{"params": params[:2]}, {"params": params[2:]}], lr=1e-2)
    with pytest.raises(CheckpointError, match="1 parameter groups, this run has 2"):
        load_training_state(path, two_groups)

    wider = _lora(r=8)
    with pytest.raises(CheckpointError, match=r"shape \(4, 64\).*\(8, 64\)"):
        load_training_state(path, _adamw(wider), wider)

    plain, _ = tiny_random_model()
    with pytest.raises(CheckpointError, match="not a PEFT model"):
        load_training_state(path, optimizer, plain)
    # nothing was changed by the failed loads
    assert load_training_state(path, optimizer, model) == {"step": 10}
