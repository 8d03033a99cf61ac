"""The sandbox API models: file bytes are raw in Python and strict base64 in JSON."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from horizonrl.sandbox.base import ExecRequest, FileData, WriteFileRequest


def test_file_bytes_round_trip_raw_in_python_base64_in_json() -> None:
    payload = b"\x00\xffraw!! not base64"
    data = FileData(path="a.bin", data=payload)
    assert data.data == payload
    text = data.model_dump_json()
    assert '"data":"AP9yYXch' in text
    assert FileData.model_validate_json(text).data == payload


@pytest.mark.parametrize("bad", ["!!", "abc", "aGVsbG8=\n!"])
def test_malformed_base64_is_an_error_not_garbage(bad: str) -> None:
    with pytest.raises(ValidationError, match="base64"):
        WriteFileRequest.model_validate({"path": "a", "data": bad})


def test_exec_request_validation() -> None:
    for body in ({"cmd": ""}, {"cmd": "ls", "timeout": 0}, {"cmd": "a\0b"}, {"cmd": "ls", "extra": 1}):
        with pytest.raises(ValidationError):
            ExecRequest.model_validate(body)
