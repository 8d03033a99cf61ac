"""The trajectory record: JSONL round trip, alignment checks, bad lines named by file:line."""

import json

import pytest

from horizonrl.errors import DataError
from horizonrl.types import (
    Message,
    Task,
    ToolCall,
    Trajectory,
    read_tasks,
    read_trajectories,
    write_trajectories,
)


def make_traj(i: int = 0, **kw) -> Trajectory:
    base = dict(
        id=f"t{i}",
        task_id="task",
        group_id="task",
        env="calc",
        messages=[
            Message(role="user", content="2+2?"),
            Message(
                role="assistant",
                content='<tool_call>{"name":"finish","arguments":{"answer":"4"}}</tool_call>',
                tool_calls=[ToolCall(id="c0", name="finish", arguments={"answer": "4"})],
            ),
        ],
        prompt_ids=[1, 2, 3],
        response_ids=[4, 5, 6],
        loss_mask=[1, 1, 0],
        logprobs=[-0.5, -0.25, 0.0],
        reward=1.0,
        turn_rewards=[1.0],
        num_turns=1,
        finish="finished",
    )
    base.update(kw)
    return Trajectory(**base)


def test_trajectory_jsonl_round_trip(tmp_path):
    path = tmp_path / "t.jsonl"
    trajs = [make_traj(i) for i in range(3)]
    assert write_trajectories(path, trajs) == 3
    back = read_trajectories(path)
    assert back == trajs
    assert back[0].success


def test_record_has_schema_fields_and_openai_tool_calls(tmp_path):
    record = json.loads(make_traj().to_json())
    for key in [
        "id",
        "task_id",
        "group_id",
        "env",
        "messages",
        "prompt_ids",
        "response_ids",
        "loss_mask",
        "logprobs",
        "reward",
        "turn_rewards",
        "num_turns",
        "finish",
        "error",
        "metrics",
        "timings",
    ]:
        assert key in record
    assert record["schema_version"] == 1
    call = record["messages"][1]["tool_calls"][0]
    assert call["type"] == "function"
    assert json.loads(call["function"]["arguments"]) == {"answer": "4"}
    assert set(record["timings"]) == {"init_s", "run_s", "eval_s"}


def test_misaligned_lengths_rejected():
    with pytest.raises(ValueError, match="equal lengths"):
        make_traj(loss_mask=[1, 1])


def test_nan_reward_rejected_naming_trajectory():
    with pytest.raises(ValueError, match=r"t0.*finite"):
        make_traj(reward=float("nan"))


def test_bad_line_in_trajectory_file_names_file_and_line(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trajectories(path, [make_traj(0)])
    with path.open("a") as f:
        f.write('{"id": "broken"}\n')
    with pytest.raises(DataError, match=r"t\.jsonl:2"):
        read_trajectories(path)


def test_task_file_bad_line_and_missing_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(Task(id="a", env="calc").model_dump_json() + "\n" + "not json\n")
    with pytest.raises(DataError, match=r"tasks\.jsonl:2"):
        read_tasks(path)
    with pytest.raises(DataError, match="does not exist"):
        read_tasks(tmp_path / "missing.jsonl")


def test_transcript_shows_an_id_with_brackets_as_text_not_markup():
    from builders import make_traj as build
    from rich.console import Console

    from horizonrl.report import transcript

    console = Console(record=True, width=100)
    console.print(transcript(build("task[/red]-[bold]7", [1], [2], reward=1.0)))
    assert "task[/red]-[bold]7" in console.export_text()


def test_reading_records_names_a_non_utf8_line_a_directory_and_a_missing_file(tmp_path):
    from horizonrl.types import read_trajectories

    bad = tmp_path / "t.jsonl"
    bad.write_bytes(b"\n\n\xff\xfe not text\n")
    with pytest.raises(DataError, match=r"t\.jsonl:3: not UTF-8 text \(byte 0xff\)"):
        read_trajectories(bad)
    with pytest.raises(DataError, match="is a directory; give a file"):
        read_trajectories(tmp_path)
    with pytest.raises(DataError, match="does not exist"):
        read_trajectories(tmp_path / "missing.jsonl")
