"""The ``str_replace_editor`` tool (:mod:`horizonrl.envs.swe.editor`) against real bubblewrap sandboxes:
every command's success and error paths, paths outside the workspace, truncation, undo, and that the
workspace's ``diff`` shows exactly the intended change."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from horizonrl.envs.swe.editor import COMMANDS, EDITOR_DESCRIPTION, Editor
from horizonrl.envs.tools import parse_docstring
from horizonrl.sandbox.base import SandboxSpec
from horizonrl.sandbox.bwrap import BwrapBackend, BwrapOptions, BwrapSandbox

if shutil.which("bwrap") is None:  # never silently: the reason is printed with -ra
    pytest.skip("bubblewrap (bwrap) is not installed; `make setup` installs it", allow_module_level=True)

CALC = """\
def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def mul(a, b):
    result = 0
    for _ in range(b):
        result = add(result, a)
    return result
"""


@pytest.fixture
def template(tmp_path: Path) -> Path:
    """A small Python package, three levels deep, with hidden files at two levels."""
    root = tmp_path / "template"
    (root / "calc" / "ops" / "deep").mkdir(parents=True)
    (root / "calc" / "__init__.py").write_text("from calc.core import add, mul, sub\n")
    (root / "calc" / "core.py").write_text(CALC)
    (root / "calc" / "ops" / "__init__.py").write_text("")
    (root / "calc" / "ops" / "deep" / "far.py").write_text("X = 1\n")
    (root / "calc" / ".cache").write_text("hidden\n")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "secret.txt").write_text("hidden\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_core.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    )
    (root / "README.md").write_text("# calc\n")
    return root


@pytest.fixture
async def sandbox(tmp_path: Path, template: Path) -> AsyncIterator[BwrapSandbox]:
    backend = BwrapBackend(BwrapOptions(state_dir=str(tmp_path / "state"), cache_dir=str(tmp_path / "cache")))
    try:
        async with await backend.create(SandboxSpec(template=str(template))) as box:
            yield box
    finally:
        await backend.aclose()


@pytest.fixture
def editor(sandbox: BwrapSandbox) -> Editor:
    return Editor(sandbox)


def diff_lines(diff: str) -> list[str]:
    """The added and removed lines of a git diff (without the ---/+++ headers)."""
    return [line for line in diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]


# --- view -----------------------------------------------------------------------------------------


async def test_view_file_numbers_lines_like_cat_n(editor: Editor, sandbox: BwrapSandbox) -> None:
    out = await editor.run("view", "/workspace/calc/__init__.py")
    assert out == (
        "Here's the result of running `cat -n` on /workspace/calc/__init__.py:\n"
        "     1\tfrom calc.core import add, mul, sub\n"
    )
    expected = (await sandbox.exec("cat -n calc/core.py")).stdout
    relative = await editor.run("view", "calc/core.py")
    assert relative.split(":\n", 1)[1] == expected
    assert relative.startswith("Here's the result of running `cat -n` on /workspace/calc/core.py:\n")


async def test_view_range_shows_those_lines_and_minus_one_means_to_the_end(editor: Editor) -> None:
    out = await editor.run("view", "calc/core.py", view_range=[5, 6])
    assert out.split(":\n", 1)[1] == "     5\tdef sub(a, b):\n     6\t    return a - b\n"
    tail = await editor.run("view", "calc/core.py", view_range=[12, -1])
    assert tail.split(":\n", 1)[1] == "    12\t        result = add(result, a)\n    13\t    return result\n"
    one = await editor.run("view", "calc/core.py", view_range=[13, 13])
    assert one.split(":\n", 1)[1] == "    13\t    return result\n"


@pytest.mark.parametrize(
    ("view_range", "expected"),
    [
        ([0, 3], "first element `0` should be within the range of lines of the file: [1, 13]"),
        ([14, -1], "first element `14` should be within the range of lines of the file: [1, 13]"),
        ([5, 20], "second element `20` should be at most the number of lines in the file, 13"),
        ([5, 3], "second element `3` should be larger than or equal to its first `5`"),
        ([5], "It should be a list of two integers"),
        (["1", "2"], "It should be a list of two integers"),
    ],
    ids=["start-0", "start-past-end", "end-past-end", "end-before-start", "one-element", "strings"],
)
async def test_invalid_view_ranges_are_errors_naming_the_line_count(
    editor: Editor, view_range: list, expected: str
) -> None:
    out = await editor.run("view", "calc/core.py", view_range=view_range)
    assert out.startswith("ERROR: Invalid `view_range` parameter")
    assert expected in out


async def test_view_directory_lists_two_levels_without_hidden_entries(editor: Editor) -> None:
    out = await editor.run("view", "/workspace")
    header, listing = out.split(":\n", 1)
    assert (
        header == "Here's the files and directories up to 2 levels deep in /workspace, excluding hidden items"
    )
    assert listing.splitlines() == [
        "/workspace",
        "/workspace/README.md",
        "/workspace/calc",
        "/workspace/calc/__init__.py",
        "/workspace/calc/core.py",
        "/workspace/calc/ops",
        "/workspace/tests",
        "/workspace/tests/test_core.py",
    ]
    sub = await editor.run("view", "calc")
    assert sub.split(":\n", 1)[1].splitlines() == [
        "/workspace/calc",
        "/workspace/calc/__init__.py",
        "/workspace/calc/core.py",
        "/workspace/calc/ops",
        "/workspace/calc/ops/__init__.py",
        "/workspace/calc/ops/deep",
    ]
    assert "`view_range` parameter is not allowed" in await editor.run("view", "calc", view_range=[1, 2])


async def test_view_of_a_missing_path_is_an_error(editor: Editor) -> None:
    out = await editor.run("view", "calc/nope.py")
    assert out == "ERROR: The path /workspace/calc/nope.py does not exist. Please provide a valid path."
    assert (await editor.run("view", "")).startswith("ERROR: `path` must be a non-empty string")


async def test_view_of_a_non_utf8_file_replaces_bad_bytes(editor: Editor, sandbox: BwrapSandbox) -> None:
    await sandbox.write_file("blob.bin", b"ok\n\xff\xfe bad\n")
    out = await editor.run("view", "blob.bin")
    assert "not valid UTF-8" in out
    assert out.endswith("     1\tok\n     2\t\ufffd\ufffd bad\n")


async def test_view_of_an_empty_file_says_so(editor: Editor, sandbox: BwrapSandbox) -> None:
    assert "[The file is empty.]" in await editor.run("view", "calc/ops/__init__.py")


# --- create ---------------------------------------------------------------------------------------


async def test_create_writes_a_new_file_in_new_directories(editor: Editor, sandbox: BwrapSandbox) -> None:
    out = await editor.run("create", "calc/extra/div.py", file_text="def div(a, b):\n\treturn a / b\n")
    assert out == "File created successfully at: /workspace/calc/extra/div.py"
    assert await sandbox.read_file("calc/extra/div.py") == b"def div(a, b):\n\treturn a / b\n"
    diff = await sandbox.diff()
    assert "+++ b/calc/extra/div.py" in diff
    assert diff_lines(diff) == ["+def div(a, b):", "+\treturn a / b"]


async def test_create_refuses_existing_files_directories_and_missing_text(
    editor: Editor, sandbox: BwrapSandbox
) -> None:
    out = await editor.run("create", "/workspace/README.md", file_text="overwritten\n")
    assert out.startswith("ERROR: File already exists at: /workspace/README.md")
    assert "use `str_replace` to edit it" in out
    assert (await editor.run("create", "calc", file_text="x")).startswith(
        "ERROR: The path /workspace/calc is a directory"
    )
    assert (
        await editor.run("create", "new.py")
        == "ERROR: Parameter `file_text` is required for command: create."
    )
    assert await sandbox.diff() == ""


# --- str_replace ----------------------------------------------------------------------------------


async def test_str_replace_edits_the_one_match_and_shows_a_snippet(
    editor: Editor, sandbox: BwrapSandbox
) -> None:
    out = await editor.run(
        "str_replace", "calc/core.py", old_str="    return a - b\n", new_str="    return a - b - 0\n"
    )
    assert out.startswith(
        "The file /workspace/calc/core.py has been edited. Here's the result of running `cat -n` on a "
        "snippet of /workspace/calc/core.py:\n"
    )
    assert "     2\t    return a + b\n" in out  # 4 lines of context above line 6
    assert "     6\t    return a - b - 0\n" in out
    assert "    11\t    for _ in range(b):\n" in out
    assert "     1\t" not in out and "    12\t" not in out
    assert out.endswith(
        "Review the changes and make sure they are as expected. Edit the file again if necessary."
    )
    diff = await sandbox.diff()
    assert diff_lines(diff) == ["-    return a - b", "+    return a - b - 0"]


async def test_str_replace_with_no_match_is_an_error(editor: Editor, sandbox: BwrapSandbox) -> None:
    out = await editor.run("str_replace", "calc/core.py", old_str="return a * b", new_str="x")
    assert out == (
        "ERROR: No replacement was performed, old_str `return a * b` did not appear verbatim in "
        "/workspace/calc/core.py."
    )
    # whitespace counts: a tab is not four spaces, "a,b" is not "a, b"
    for old_str in ("\treturn a + b", "def add(a,b):"):
        out = await editor.run("str_replace", "calc/core.py", old_str=old_str, new_str="x")
        assert out.startswith("ERROR: No replacement was performed") and "did not appear verbatim" in out
    assert await sandbox.diff() == ""


async def test_str_replace_with_several_matches_lists_their_lines(
    editor: Editor, sandbox: BwrapSandbox
) -> None:
    out = await editor.run("str_replace", "calc/core.py", old_str="(a, b):\n", new_str="(a, b=1):\n")
    assert out.startswith("ERROR: No replacement was performed. Multiple occurrences of old_str")
    assert "in lines [1, 5, 9] (3 occurrences)" in out
    out = await editor.run("str_replace", "calc/core.py", old_str="result", new_str="acc")
    assert "in lines [10, 12, 13] (4 occurrences)" in out
    assert await sandbox.diff() == ""


async def test_str_replace_deletes_with_empty_or_missing_new_str(
    editor: Editor, sandbox: BwrapSandbox
) -> None:
    out = await editor.run("str_replace", "calc/core.py", old_str="\n\ndef sub(a, b):\n    return a - b\n")
    assert "has been edited" in out
    out = await editor.run("str_replace", "README.md", old_str="# calc\n", new_str="")
    assert "has been edited" in out
    assert await sandbox.read_file("README.md") == b""
    assert (
        await sandbox.read_file("calc/core.py")
        == CALC.replace("\n\ndef sub(a, b):\n    return a - b\n", "").encode()
    )
    # git may attribute the removed blank lines to either side of the function: compare as a multiset
    assert sorted(diff_lines(await sandbox.diff())) == sorted(
        ["-# calc", "-", "-", "-def sub(a, b):", "-    return a - b"]
    )


async def test_str_replace_keeps_tabs_and_exact_text(editor: Editor, sandbox: BwrapSandbox) -> None:
    await editor.run("create", "tabs.mk", file_text="all:\n\techo one\n\techo two\r\n")
    out = await editor.run("str_replace", "tabs.mk", old_str="\techo two\r\n", new_str="\techo\ttwo\r\n")
    assert "\techo\ttwo" in out
    assert await sandbox.read_file("tabs.mk") == b"all:\n\techo one\n\techo\ttwo\r\n"
    out = await editor.run("str_replace", "tabs.mk", old_str="    echo one", new_str="x")
    assert "did not appear verbatim" in out


async def test_str_replace_refuses_bad_calls(editor: Editor, sandbox: BwrapSandbox) -> None:
    await sandbox.write_file("blob.bin", b"abc\xff\n")
    out = await editor.run("str_replace", "blob.bin", old_str="abc", new_str="x")
    assert out.startswith("ERROR: /workspace/blob.bin is not UTF-8 text")
    assert await sandbox.read_file("blob.bin") == b"abc\xff\n"
    out = await editor.run("str_replace", "calc/core.py", new_str="x")
    assert out == "ERROR: Parameter `old_str` is required for command: str_replace."
    assert "must not be empty" in await editor.run("str_replace", "calc/core.py", old_str="", new_str="x")
    assert "are the same" in await editor.run("str_replace", "README.md", old_str="# calc", new_str="# calc")
    out = await editor.run("str_replace", "calc", old_str="a", new_str="b")
    assert out.startswith("ERROR: The path /workspace/calc is a directory and only the `view` command")
    out = await editor.run("str_replace", "missing.py", old_str="a", new_str="b")
    assert out == "ERROR: The path /workspace/missing.py does not exist. Please provide a valid path."


# --- insert ---------------------------------------------------------------------------------------


async def test_insert_at_the_top_and_at_the_end(editor: Editor, sandbox: BwrapSandbox) -> None:
    out = await editor.run("insert", "calc/core.py", new_str='"""Arithmetic."""\n', insert_line=0)
    assert '     1\t"""Arithmetic."""\n     2\tdef add(a, b):\n' in out
    assert "(correct indentation, no duplicate lines, etc)" in out
    out = await editor.run("insert", "calc/core.py", new_str="\n\ndef neg(a):\n    return -a", insert_line=14)
    assert "    11\t    result = 0\n" in out and "    18\t    return -a\n" in out  # 4 lines of context
    assert "    10\t" not in out
    text = (await sandbox.read_file("calc/core.py")).decode()
    assert text == '"""Arithmetic."""\n' + CALC + "\n\ndef neg(a):\n    return -a\n"
    assert diff_lines(await sandbox.diff()) == [
        '+"""Arithmetic."""',
        "+",
        "+",
        "+def neg(a):",
        "+    return -a",
    ]


async def test_insert_in_the_middle_and_after_a_last_line_without_newline(
    editor: Editor, sandbox: BwrapSandbox
) -> None:
    await sandbox.write_file("n.txt", b"one\ntwo")
    await editor.run("insert", "n.txt", new_str="one and a half", insert_line=1)
    await editor.run("insert", "n.txt", new_str="three", insert_line=3)
    assert await sandbox.read_file("n.txt") == b"one\none and a half\ntwo\nthree"


async def test_insert_out_of_range_names_the_valid_range(editor: Editor, sandbox: BwrapSandbox) -> None:
    out = await editor.run("insert", "calc/core.py", new_str="x", insert_line=14)
    assert out.startswith("ERROR: Invalid `insert_line` parameter: 14.")
    assert "[0, 13]" in out
    assert "[0, 13]" in await editor.run("insert", "calc/core.py", new_str="x", insert_line=-1)
    assert "`new_str` is required" in await editor.run("insert", "calc/core.py", insert_line=1)
    assert "`insert_line` is required" in await editor.run("insert", "calc/core.py", new_str="x")
    assert "must be an integer" in await editor.run("insert", "calc/core.py", new_str="x", insert_line="2")
    assert await sandbox.diff() == ""


# --- undo_edit ------------------------------------------------------------------------------------


async def test_undo_reverts_each_kind_of_edit_in_order(editor: Editor, sandbox: BwrapSandbox) -> None:
    await editor.run("str_replace", "calc/core.py", old_str="return a + b", new_str="return b + a")
    await editor.run("insert", "/workspace/calc/core.py", new_str="# top", insert_line=0)
    await editor.run("create", "calc/new.py", file_text="NEW = 1\n")
    assert len(diff_lines(await sandbox.diff())) == 4

    out = await editor.run("undo_edit", "calc/new.py")
    assert out.startswith("Last edit to /workspace/calc/new.py undone successfully")
    assert (await sandbox.exec("test -e calc/new.py")).exit_code == 1

    out = await editor.run("undo_edit", "calc/core.py")  # the history is per path, whatever its spelling
    assert out.startswith("Last edit to /workspace/calc/core.py undone successfully.")
    assert "     1\tdef add(a, b):\n     2\t    return b + a\n" in out
    assert diff_lines(await sandbox.diff()) == ["-    return a + b", "+    return b + a"]

    await editor.run("undo_edit", "/workspace/calc/core.py")
    assert await sandbox.read_file("calc/core.py") == CALC.encode()
    assert await sandbox.diff() == ""


async def test_undo_with_no_history_is_an_error(editor: Editor, sandbox: BwrapSandbox) -> None:
    out = await editor.run("undo_edit", "calc/core.py")
    assert out.startswith("ERROR: No edit history found for /workspace/calc/core.py")
    await editor.run("insert", "calc/core.py", new_str="# x", insert_line=0)
    assert "undone successfully" in await editor.run("undo_edit", "calc/core.py")
    assert (await editor.run("undo_edit", "calc/core.py")).startswith("ERROR: No edit history found")
    # failed edits are not recorded
    await editor.run("create", "README.md", file_text="x")
    assert (await editor.run("undo_edit", "README.md")).startswith("ERROR: No edit history found")
    assert await sandbox.diff() == ""


# --- paths, truncation, commands ------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["../etc/passwd", "/etc/passwd", "calc/../../etc/passwd", "/workspace/../etc"]
)
async def test_paths_outside_the_workspace_are_errors(editor: Editor, path: str) -> None:
    for command, kwargs in [
        ("view", {}),
        ("create", {"file_text": "x"}),
        ("str_replace", {"old_str": "root", "new_str": "x"}),
        ("insert", {"new_str": "x", "insert_line": 0}),
    ]:
        out = await editor.run(command, path, **kwargs)
        assert out.startswith(f"ERROR: The path {path} resolves to /etc"), out
        assert "Only files under /workspace" in out


async def test_symlinks_out_of_the_workspace_are_errors(editor: Editor, sandbox: BwrapSandbox) -> None:
    await sandbox.exec("ln -s /etc etc_link && ln -s /etc/passwd calc/pw")
    for path in ("etc_link", "etc_link/passwd", "/workspace/calc/pw"):
        out = await editor.run("view", path)
        assert out.startswith(f"ERROR: The path {path} resolves to /etc"), out
        assert "outside the workspace" in out and "/workspace" in out
    out = await editor.run("create", "etc_link/evil", file_text="x")
    assert out.startswith("ERROR: The path etc_link/evil resolves to /etc/evil")
    out = await editor.run("str_replace", "calc/pw", old_str="root", new_str="x")
    assert out.startswith("ERROR:") and "outside the workspace" in out


async def test_symlinks_inside_the_workspace_edit_their_target(editor: Editor, sandbox: BwrapSandbox) -> None:
    await sandbox.exec("ln -s calc/core.py link.py")
    await editor.run("str_replace", "link.py", old_str="return a + b", new_str="return a + b + 0")
    assert b"return a + b + 0" in await sandbox.read_file("calc/core.py")
    assert (await sandbox.exec("test -L link.py")).exit_code == 0


async def test_long_outputs_are_cut_with_a_note(sandbox: BwrapSandbox) -> None:
    editor = Editor(sandbox, max_output_chars=500)
    await sandbox.write_file("big.txt", "".join(f"line {i}\n" for i in range(1, 1001)).encode())
    out = await editor.run("view", "big.txt")
    body, note = out.split("<response clipped>")
    assert len(body) <= 500 and body.endswith("\n")
    assert "view_range" in note and "grep -n" in note
    assert "line 1000" not in out
    assert "<response clipped>" not in await editor.run("view", "big.txt", view_range=[990, 1000])

    await sandbox.exec("mkdir many && cd many && for i in $(seq 1 100); do touch file_$i.py; done")
    out = await editor.run("view", "many")
    body, note = out.split("<response clipped>")
    assert len(body) <= 500 and "subdirectory" in note


async def test_unknown_command_lists_the_valid_ones(editor: Editor) -> None:
    out = await editor.run("delete", "README.md")
    assert out == (
        "ERROR: Unrecognized command 'delete'. The allowed commands are: "
        "view, create, str_replace, insert, undo_edit."
    )
    assert COMMANDS == ("view", "create", "str_replace", "insert", "undo_edit")


def test_description_documents_the_tool_and_every_parameter() -> None:
    description, params = parse_docstring(EDITOR_DESCRIPTION)
    assert "exactly one" in description.lower() and "/workspace" in description
    assert set(params) == {"command", "path", "file_text", "old_str", "new_str", "insert_line", "view_range"}
    assert all(len(text) > 20 for text in params.values())
