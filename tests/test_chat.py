"""Incremental chat tokenization: appended deltas equal the template's own rendering."""

from horizonrl.chat import ChatFormat
from horizonrl.envs.calc import CalcEnv
from horizonrl.toolcalls import format_tool_call
from horizonrl.types import Message

CALC = next(t for t in CalcEnv().tools if t.name == "calculator")


def test_smollm2_template_gets_tools_in_system_prompt(tokenizer):
    chat = ChatFormat(tokenizer, [CALC])
    assert not chat.native_tools
    text = chat.render([Message(role="system", content="Solve."), Message(role="user", content="1+1")], True)
    assert text.startswith("<|im_start|>system\nSolve.\n\n# Tools")
    assert '"name": "calculator"' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_incremental_sequence_equals_full_rendering(tokenizer):
    chat = ChatFormat(tokenizer, [CALC])
    messages = [Message(role="system", content="Solve."), Message(role="user", content="What is 17 * 23?")]
    seq = chat.prompt_ids(messages)
    for i, (call, result) in enumerate([("17 * 23", "391"), ("391 - 5", "386")]):
        generated = chat.encode("Computing.\n" + format_tool_call("calculator", {"expression": call}))
        generated.append(tokenizer.eos_token_id)
        seq += generated + chat.close_turn_ids(generated)
        messages.append(Message(role="assistant", content=chat.decode(generated)))
        obs = [Message(role="tool", content=result, tool_call_id=f"c{i}", name="calculator")]
        seq += chat.observation_ids(obs)
        messages += obs
    assert chat.drift(messages, seq) == 0
    assert tokenizer.decode(seq).count("<tool_response>") == 2


def test_turn_cut_by_length_is_closed_with_the_full_suffix(tokenizer):
    chat = ChatFormat(tokenizer, [CALC])
    cut = chat.encode("I will compute")  # no eos: the token limit ended the turn
    assert tokenizer.decode(chat.close_turn_ids(cut)) == "<|im_end|>\n"
    ended = [*cut, tokenizer.eos_token_id]
    assert tokenizer.decode(chat.close_turn_ids(ended)) == "\n"


def test_consecutive_tool_results_share_one_user_turn(tokenizer):
    chat = ChatFormat(tokenizer, [CALC])
    obs = [
        Message(role="tool", content="1", tool_call_id="a"),
        Message(role="tool", content="2", tool_call_id="b"),
    ]
    delta = tokenizer.decode(chat.observation_ids(obs))
    assert delta == (
        "<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_drift_is_counted_when_sequence_differs(tokenizer):
    chat = ChatFormat(tokenizer, [CALC])
    messages = [Message(role="system", content="S"), Message(role="user", content="U")]
    seq = chat.prompt_ids(messages)
    assert chat.drift(messages, seq) == 0
    assert chat.drift(messages, [*seq[:-1], seq[-1] + 1]) == 1
    assert chat.drift(messages, seq[:-2]) == 2
