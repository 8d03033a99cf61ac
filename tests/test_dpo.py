"""DPO: the loss against a hand computation, tokenization with the agent's chat format (the loss mask on
exactly the assistant's tokens), the reference from the starting policy, training that widens the
chosen-vs-rejected margin, clear errors on bad data and config, and `horizon dpo` end to end."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from horizonrl.algos import losses
from horizonrl.chat import ChatFormat
from horizonrl.cli import app
from horizonrl.config import DPOConfig, load_config
from horizonrl.envs.calc import CalcEnv
from horizonrl.errors import ConfigError, DataError
from horizonrl.model_config import LoraSettings
from horizonrl.train.dpo import preference_stats, score_pairs, train_dpo
from horizonrl.train.preference_pairs import PreferencePair, encode_continuation, encode_pairs, read_pairs
from horizonrl.trainable import wrap_lora
from horizonrl.types import Message

CALC_PAIRS = "configs/data/calc_pairs.jsonl"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The tiny model's matmuls gain nothing from threads, and on a busy 2-core machine OpenMP's
    thread sync made these tests ~30x slower; one thread keeps them fast either way."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def short_pairs() -> list[PreferencePair]:
    """Two small pairs without a system prompt (fast on the tiny model)."""
    return [
        PreferencePair(
            id="add",
            prompt=[user("What is 2 + 3?")],
            chosen=[assistant("It is 5.")],
            rejected=[assistant("7")],
        ),
        PreferencePair(
            id="capital",
            prompt=[user("Capital of France?")],
            chosen=[assistant("Paris.")],
            rejected=[assistant("It is Rome, I think.")],
        ),
    ]


def lora_copy(model, seed: int = 0):
    torch.manual_seed(seed)
    return wrap_lora(copy.deepcopy(model), LoraSettings(r=4, alpha=8))


# ---------------------------------------------------------------- the loss


def test_dpo_loss_matches_a_hand_computation():
    pc, pr = torch.tensor([-10.0, -4.0], requires_grad=True), torch.tensor([-12.0, -3.0])
    rc, rr = torch.tensor([-11.0, -5.0]), torch.tensor([-11.0, -5.0])
    loss, stats = losses.dpo(pc, pr, rc, rr, beta=0.5)
    # pair 0: 0.5 * ((-10 + 11) - (-12 + 11)) = 1.0; pair 1: 0.5 * ((-4 + 5) - (-3 + 5)) = -0.5
    expected = (math.log(1 + math.exp(-1.0)) + math.log(1 + math.exp(0.5))) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["reward_accuracy"] == 0.5
    assert stats["reward_margin"] == pytest.approx(0.25)
    assert stats["chosen_reward"] == pytest.approx((0.5 + 0.5) / 2)
    assert stats["rejected_reward"] == pytest.approx((-0.5 + 1.0) / 2)
    loss.backward()  # d/d pc_i = -beta * sigmoid(-z_i) / B
    sig = [1 / (1 + math.exp(1.0)), 1 / (1 + math.exp(-0.5))]
    assert pc.grad.tolist() == pytest.approx([-0.5 * s / 2 for s in sig], abs=1e-6)
    same = torch.tensor([-3.0, -7.0])
    assert losses.dpo(same, same, same, same)[0].item() == pytest.approx(math.log(2))


def test_dpo_loss_names_bad_inputs():
    ok = torch.zeros(3)
    with pytest.raises(ValueError, match="ref_rejected_logp is not finite at rows \\[1\\]"):
        losses.dpo(ok, ok, ok, torch.tensor([0.0, float("nan"), 0.0]))
    with pytest.raises(ValueError, match="policy_rejected_logp: expected shape \\(3,\\)"):
        losses.dpo(ok, torch.zeros(2), ok, ok)
    with pytest.raises(ValueError, match="policy_chosen_logp: expected shape \\[B\\]"):
        losses.dpo(torch.zeros(3, 1), ok, ok, ok)
    with pytest.raises(ValueError, match="beta"):
        losses.dpo(ok, ok, ok, ok, beta=0.0)


# ---------------------------------------------------------------- tokenization


def _mask_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    runs, current = [], []
    for token, bit in zip(ids, mask, strict=True):
        if bit:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def test_loss_mask_covers_exactly_the_assistant_turns_of_the_continuation(tokenizer):
    pair = read_pairs(CALC_PAIRS, limit=1)[0]
    tools = CalcEnv().tools
    [encoded] = encode_pairs([pair], tokenizer, tools)
    chat = ChatFormat(tokenizer, tools)
    for side in ("chosen", "rejected"):
        traj = getattr(encoded, side)
        written = [m.content for m in getattr(pair, side) if m.role == "assistant"]
        runs = _mask_runs(traj.response_ids, traj.loss_mask)
        assert [chat.decode(run) for run in runs] == written
        assert all(run[-1] == tokenizer.eos_token_id for run in runs)  # each turn ends itself
        # the prompt is the agent's prompt, and the whole sequence is the template's rendering
        assert traj.prompt_ids == chat.prompt_ids(pair.prompt)
        assert chat.drift(traj.messages, traj.prompt_ids + traj.response_ids) == 0
    # the two sides differ only in the final answer
    assert encoded.chosen.prompt_ids == encoded.rejected.prompt_ids
    assert encoded.chosen.response_ids != encoded.rejected.response_ids


def test_tool_calls_given_only_as_tool_calls_are_written_in_the_agent_format(tokenizer):
    chat = ChatFormat(tokenizer, CalcEnv().tools)
    call = {"id": "c1", "type": "function", "function": {"name": "finish", "arguments": '{"answer": "5"}'}}
    message = Message.model_validate({"role": "assistant", "content": "", "tool_calls": [call]})
    _, response, mask = encode_continuation(chat, [Message(role="user", content="2+3?")], [message])
    [run] = _mask_runs(response, mask)
    assert chat.decode(run) == '<tool_call>\n{"name": "finish", "arguments": {"answer": "5"}}\n</tool_call>'


# ---------------------------------------------------------------- reference and training


def test_reference_is_the_policy_with_its_adapter_off_and_step_zero_loss_is_log_2(tiny_model_and_tokenizer):
    base, tokenizer = tiny_model_and_tokenizer
    pairs = encode_pairs(short_pairs(), tokenizer)
    pad = tokenizer.pad_token_id
    policy = lora_copy(base)
    # a non-zero adapter: the reference must still be the base model
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.1)
    ref = score_pairs(policy, pairs, pad, 4096, reference=True)
    expected = score_pairs(base, pairs, pad, 4096)
    assert torch.allclose(ref[0], expected[0], atol=1e-5) and torch.allclose(ref[1], expected[1], atol=1e-5)
    assert not torch.allclose(score_pairs(policy, pairs, pad, 4096)[0], ref[0], atol=1e-3)

    # a fresh adapter starts as the base model: the first step's loss is log 2, rewards 0
    fresh = lora_copy(base)
    history = train_dpo(fresh, pairs, DPOConfig(epochs=1, batch_size=2), pad)
    assert history[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert abs(history[0]["reward_margin"]) < 1e-5 and history[0]["reward_accuracy"] == 0.0


def test_full_fine_tuning_uses_the_starting_weights_as_reference(tiny_model_and_tokenizer):
    base, tokenizer = tiny_model_and_tokenizer
    pairs = encode_pairs(short_pairs(), tokenizer)
    model = copy.deepcopy(base).requires_grad_(True)
    history = train_dpo(model, pairs, DPOConfig(epochs=2, batch_size=2, lr=1e-3), tokenizer.pad_token_id)
    assert history[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert history[-1]["loss"] < history[0]["loss"]


def test_a_few_steps_widen_the_margin_between_chosen_and_rejected(tiny_model_and_tokenizer):
    base, tokenizer = tiny_model_and_tokenizer
    pairs = encode_pairs(short_pairs(), tokenizer)
    pad = tokenizer.pad_token_id
    policy = lora_copy(base)
    cfg = DPOConfig(epochs=4, batch_size=2, lr=2e-2, micro_batch_tokens=64)  # one pair per micro-batch
    reference = score_pairs(policy, pairs, pad, 4096, reference=True)
    seen: list[int] = []
    history = train_dpo(policy, pairs, cfg, pad, on_step=lambda step, total, stats: seen.append(total))
    assert len(history) == 4 and seen == [4] * 4
    losses_ = [h["loss"] for h in history]
    assert losses_[-1] < losses_[0] - 0.1, losses_
    assert history[-1]["reward_accuracy"] == 1.0 and history[-1]["reward_margin"] > 0.2
    after = preference_stats(score_pairs(policy, pairs, pad, 4096), reference, cfg.beta)
    assert after["reward_accuracy"] == 1.0 and after["loss"] < math.log(2)
    assert {"grad_norm", "lr", "chosen_logp", "rejected_logp"} <= set(history[0])


def test_length_normalize_scores_the_mean_token_logprob(tiny_model_and_tokenizer):
    base, tokenizer = tiny_model_and_tokenizer
    pairs = encode_pairs(short_pairs(), tokenizer)
    pad = tokenizer.pad_token_id
    total = score_pairs(base, pairs, pad, 4096)
    mean = score_pairs(base, pairs, pad, 4096, length_normalize=True)
    counts = torch.tensor([sum(p.chosen.loss_mask) for p in pairs], dtype=torch.float32)
    assert torch.allclose(mean[0], total[0] / counts, atol=1e-5)


# ---------------------------------------------------------------- bad input


def _write(tmp_path, *lines: str):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _pair_line(**overrides) -> str:
    pair = {"prompt": [user("2+2?")], "chosen": [assistant("4")], "rejected": [assistant("5")]}
    return json.dumps(pair | overrides)


def test_bad_json_line_is_named(tmp_path):
    path = _write(tmp_path, _pair_line(), '{"prompt": [', _pair_line())
    with pytest.raises(DataError, match=r"pairs\.jsonl:2: not valid JSON .*\"chosen\": \[messages\]"):
        read_pairs(path)


def test_pair_without_assistant_message_is_named(tmp_path):
    path = _write(tmp_path, _pair_line(), _pair_line(rejected=[user("hm")]))
    with pytest.raises(DataError, match=r"pairs\.jsonl:2: .*rejected has no assistant message"):
        read_pairs(path)
    path = _write(tmp_path, _pair_line(chosen=[]))
    with pytest.raises(DataError, match=r"pairs\.jsonl:1: .*chosen is empty"):
        read_pairs(path)
    path = _write(tmp_path, _pair_line(chosen=[{"role": "tool", "content": "4"}, assistant("4")]))
    with pytest.raises(DataError, match="chosen starts with a 'tool' message"):
        read_pairs(path)
    path = _write(tmp_path, _pair_line(chosen=[{"role": "robot", "content": "4"}]))
    with pytest.raises(DataError, match=r"pairs\.jsonl:1: not a valid preference pair: chosen\.0\.role"):
        read_pairs(path)


def test_empty_file_duplicate_ids_and_identical_sides_are_refused(tmp_path, tokenizer):
    with pytest.raises(DataError, match="holds no pairs"):
        read_pairs(_write(tmp_path, ""))
    with pytest.raises(DataError, match="does not exist"):
        read_pairs(tmp_path / "missing.jsonl")
    with pytest.raises(DataError, match="'a' was already used on line 1"):
        read_pairs(_write(tmp_path, _pair_line(id="a"), _pair_line(id="a")))
    same = read_pairs(_write(tmp_path, _pair_line(rejected=[assistant("4")])))
    with pytest.raises(DataError, match=r"pairs\.jsonl:1.*the same tokens"):
        encode_pairs(same, tokenizer)
    assert [p.id for p in read_pairs(_write(tmp_path, _pair_line(), _pair_line()), limit=1)] == [
        "pairs.jsonl:1"
    ]


def test_missing_dpo_pairs_is_a_clear_error():
    from horizonrl.train.dpo import run_dpo

    config = load_config("configs/dpo_calc.yaml", ["dpo.pairs=null", "model.path=tiny-random"])
    with pytest.raises(ConfigError, match=r"dpo\.pairs is not set"):
        run_dpo(config)


# ---------------------------------------------------------------- the command


def test_horizon_dpo_end_to_end_on_the_tiny_model(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(p.model_dump_json(exclude_none=True) + "\n" for p in short_pairs()))
    args = [
        "dpo",
        "configs/dpo_calc.yaml",
        "model.path=tiny-random",
        f"dpo.pairs={pairs}",
        "dpo.epochs=2",
        "dpo.batch_size=1",
        "dpo.lr=1e-2",
        f"output_dir={tmp_path}",
        "name=run",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "DPO on 2 pairs, 4 steps" in result.output and "reward accuracy 0% →" in result.output
    run = tmp_path / "run"
    lines = [json.loads(line) for line in (run / "dpo_metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    assert lines[0]["loss"] == pytest.approx(math.log(2), abs=1e-3)  # bfloat16 autocast
    assert (run / "dpo_adapter" / "adapter_config.json").is_file()
    summary = json.loads((run / "dpo_summary.json").read_text())
    assert (
        summary["pairs"] == 2 and summary["after"]["reward_accuracy"] >= summary["before"]["reward_accuracy"]
    )

    missing = CliRunner().invoke(app, ["dpo", "configs/dpo_calc.yaml", "dpo.pairs=null"])
    assert missing.exit_code == 2 and "dpo.pairs is not set" in missing.output
    assert "Traceback" not in missing.output
    bad = CliRunner().invoke(app, ["dpo", "configs/dpo_calc.yaml", f"dpo.pairs={tmp_path / 'nope.jsonl'}"])
    flat = "".join(bad.output.split())  # the console wraps long lines
    assert bad.exit_code == 2 and "nope.jsonl" in flat and "doesnotexist" in flat and "dpo━" not in flat
