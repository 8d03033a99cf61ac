"""The file editor tool of OpenHands / SWE-agent (``str_replace_editor``) over a :class:`Sandbox`.

One entry point, :meth:`Editor.run`, takes the tool call's arguments and returns the observation the
model sees. Commands (OpenHands' semantics):

* ``view``: a file with line numbers like ``cat -n`` (optionally a ``view_range``), or a directory
  listed two levels deep without hidden entries;
* ``create``: a new file (never overwrites);
* ``str_replace``: replace the one occurrence of ``old_str`` (zero or several occurrences are errors);
* ``insert``: insert ``new_str`` after line ``insert_line`` (0 = at the top);
* ``undo_edit``: revert the last ``create``/``str_replace``/``insert`` of a path.

Every mistake of the model (bad path, missing argument, ambiguous ``old_str``, ...) comes back as
text starting with ``ERROR:`` — never as an exception — so it can read it and try again. Paths are
absolute (``/workspace/...``) or relative to /workspace; where they point is resolved *inside* the
sandbox (after symlinks) and anything outside /workspace is refused.
"""

from __future__ import annotations

import posixpath
import shlex
from collections import deque
from typing import Any

from horizonrl.sandbox.base import (
    WORKSPACE,
    Sandbox,
    SandboxAuthError,
    SandboxCapacityError,
    SandboxError,
    SandboxNotFoundError,
    SandboxUnavailableError,
    check_path,
)

COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")
"""The editor's commands, in the order the tool description lists them."""

SNIPPET_LINES = 4
"""Lines of context shown above and below an edit in the snippet returned after it."""

HISTORY_DEPTH = 50
"""Edits of one path that ``undo_edit`` can revert (older ones are forgotten)."""

EDIT_REVIEW = (
    "Review the changes and make sure they are as expected{advice}. Edit the file again if necessary."
)

FILE_CLIPPED = (
    "<response clipped><NOTE>The output was longer than {limit} characters, so only its beginning is "
    "shown. View the part you need with `view_range`, after finding its line numbers with "
    "`grep -n PATTERN FILE` in the shell.</NOTE>"
)
DIR_CLIPPED = (
    "<response clipped><NOTE>The listing was longer than {limit} characters, so only its beginning is "
    "shown. View a subdirectory instead, or search with `find` / `grep -rn` in the shell.</NOTE>"
)
OUTPUT_CLIPPED = "<response clipped><NOTE>The output was longer than {limit} characters.</NOTE>"

EDITOR_DESCRIPTION = """\
View, create and edit files in the workspace (/workspace).

The state persists between calls. Paths are absolute (`/workspace/src/app.py`) or relative to
/workspace (`src/app.py`); nothing outside /workspace can be read or written. Commands:
`view` shows a file with line numbers, like `cat -n` (or only the lines in `view_range`), or lists a
directory two levels deep, hidden entries excluded. `create` writes a new file; it never overwrites
an existing one (use `str_replace` to edit it). `str_replace` replaces `old_str` with `new_str`:
`old_str` must match EXACTLY ONE place in the file, character for character including whitespace and
indentation, so include enough surrounding lines to make it unique; if it matches nowhere or several
times nothing is changed. `insert` inserts `new_str` after line `insert_line`. `undo_edit` reverts
the last edit (`create`, `str_replace` or `insert`) of the file. Long outputs are cut: view large
files in parts with `view_range` and find line numbers with `grep -n` in the shell.

Args:
    command: The command to run: one of `view`, `create`, `str_replace`, `insert`, `undo_edit`.
    path: The file or directory, e.g. `/workspace/pkg/module.py` or `pkg/module.py`.
    file_text: For `create` (required): the whole content of the new file.
    old_str: For `str_replace` (required): the exact text to replace; it must occur exactly once in
        the file.
    new_str: For `str_replace`: the text replacing `old_str` (omit or leave empty to delete it). For
        `insert` (required): the text to insert.
    insert_line: For `insert` (required): the line number after which `new_str` is inserted; 0 puts it
        at the top of the file, the file's line count at its end.
    view_range: For `view` of a file (optional): `[start, end]`, 1-based line numbers, both included;
        `[start, -1]` shows from `start` to the end of the file.
"""
"""The tool description the model sees: what the editor does, then each parameter (Google style, so
:func:`horizonrl.envs.tools.parse_docstring` splits it into the tool's and the parameters' texts)."""

_INFRASTRUCTURE_ERRORS = (
    SandboxNotFoundError,
    SandboxUnavailableError,
    SandboxAuthError,
    SandboxCapacityError,
)
"""Sandbox errors that are not the model's doing (the sandbox is gone, the server refuses us): they
propagate instead of becoming an observation."""


class EditorError(Exception):
    """A mistake in a tool call; :meth:`Editor.run` turns it into the ``ERROR: ...`` observation."""


def _lines(text: str) -> list[str]:
    """The lines of ``text`` as ``cat -n`` counts them (split on ``\\n`` only, no trailing empty line)."""
    if not text:
        return []
    parts = text.split("\n")
    return parts[:-1] if parts[-1] == "" else parts


def _numbered(lines: list[str], first: int) -> str:
    """``cat -n`` style: each line as a 6-wide line number, a tab and the line."""
    return "".join(f"{number:6}\t{line}\n" for number, line in enumerate(lines, start=first))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Editor:
    """The ``str_replace_editor`` tool over one sandbox, with a per-path undo history.

    Args:
        sandbox: The sandbox whose /workspace is edited.
        max_output_chars: Longest observation returned; longer ones are cut with a note telling the
            model how to see the rest.
    """

    def __init__(self, sandbox: Sandbox, *, max_output_chars: int = 10000) -> None:
        if max_output_chars < 1:
            raise ValueError(f"max_output_chars must be positive, not {max_output_chars}")
        self.sandbox = sandbox
        self.max_output_chars = max_output_chars
        # resolved path -> previous contents, newest last (None: the file did not exist before)
        self._history: dict[str, deque[bytes | None]] = {}

    async def run(
        self,
        command: str,
        path: str,
        file_text: str | None = None,
        old_str: str | None = None,
        new_str: str | None = None,
        insert_line: int | None = None,
        view_range: list[int] | None = None,
    ) -> str:
        """Run one editor command and return the observation the model sees.

        The arguments are those of the tool call (see :data:`EDITOR_DESCRIPTION`); arguments a
        command does not use are ignored. A bad call (unknown command, missing or ill-typed argument,
        path outside /workspace, ambiguous ``old_str``, ...) returns text starting with ``ERROR:``;
        only infrastructure failures (the sandbox is gone or refuses us) raise.
        """
        try:
            if command not in COMMANDS:
                valid = ", ".join(COMMANDS)
                raise EditorError(f"Unrecognized command {command!r}. The allowed commands are: {valid}.")
            target = await self._resolve(path)
            if command == "view":
                return await self._view(target, view_range)
            if command == "create":
                return await self._create(target, file_text)
            if command == "str_replace":
                return await self._str_replace(target, old_str, new_str)
            if command == "insert":
                return await self._insert(target, new_str, insert_line)
            return await self._undo(target)
        except EditorError as exc:
            return self._clip(f"ERROR: {exc}", OUTPUT_CLIPPED)

    # --- paths ----------------------------------------------------------------------------------

    async def _resolve(self, path: str) -> _Target:
        """Where ``path`` points inside the sandbox and what is there (checked after symlinks)."""
        if not isinstance(path, str) or not path.strip():
            raise EditorError(f"`path` must be a non-empty string: a path under {WORKSPACE}.")
        path = path.strip()
        try:
            check_path(path)
        except SandboxError as exc:
            raise EditorError(str(exc)) from None
        joined = posixpath.normpath(posixpath.join(WORKSPACE, path))
        shown = "/" + joined.lstrip("/")  # normpath keeps a leading "//"
        if shown != WORKSPACE and not shown.startswith(WORKSPACE + "/"):
            raise EditorError(
                f"The path {path} resolves to {shown}, outside the workspace. Only files under "
                f"{WORKSPACE} can be viewed or edited: use a path relative to {WORKSPACE} or an "
                f"absolute path inside it."
            )
        script = (
            f"p=$(realpath -m -- {shlex.quote(shown)}) || exit 3; "
            f'case "$p" in {WORKSPACE}|{WORKSPACE}/*) ;; *) printf "%s" "$p"; exit 4;; esac; '
            'if [ -d "$p" ]; then k=dir; elif [ -f "$p" ]; then k=file; '
            'elif [ -e "$p" ]; then k=other; else k=missing; fi; printf "%s\\n%s" "$k" "$p"'
        )
        result = await self.sandbox.exec(script, timeout=30.0)
        if result.exit_code == 4:
            raise EditorError(
                f"The path {path} resolves to {result.stdout} (through a symlink), outside the workspace. "
                f"Only files under {WORKSPACE} can be viewed or edited."
            )
        kind, sep, real = result.stdout.partition("\n")
        if not result.ok or not sep or kind not in ("dir", "file", "other", "missing"):
            detail = (result.stderr or result.stdout).strip() or f"exit {result.exit_code}"
            raise EditorError(f"Could not inspect the path {path}: {detail}")
        return _Target(shown, real, kind)

    # --- commands -------------------------------------------------------------------------------

    async def _view(self, target: _Target, view_range: Any) -> str:
        if target.kind == "missing":
            raise EditorError(f"The path {target.shown} does not exist. Please provide a valid path.")
        if target.kind == "dir":
            if view_range is not None:
                raise EditorError(
                    "The `view_range` parameter is not allowed when `path` points to a directory."
                )
            return await self._view_dir(target)
        data = await self._read(target)
        text = data.decode("utf-8", errors="replace")
        lines = _lines(text)
        first = 1
        if view_range is not None:
            first, last = self._check_range(view_range, len(lines), target.shown)
            lines = lines[first - 1 : len(lines) if last == -1 else last]
        note = ""
        if not _is_utf8(data):
            note = (
                "[The file is not valid UTF-8 text: bytes that could not be decoded are shown as \ufffd.]\n"
            )
        if not lines and view_range is None:
            note += "[The file is empty.]\n"
        header = f"Here's the result of running `cat -n` on {target.shown}:\n"
        return self._clip(header + note + _numbered(lines, first), FILE_CLIPPED)

    @staticmethod
    def _check_range(view_range: Any, n_lines: int, shown: str) -> tuple[int, int]:
        if (
            not isinstance(view_range, list | tuple)
            or len(view_range) != 2
            or not all(_is_int(v) for v in view_range)
        ):
            raise EditorError(
                f"Invalid `view_range` parameter: {view_range!r}. It should be a list of two integers "
                f"[start, end] (1-based; end -1 means to the end of the file)."
            )
        first, last = view_range
        lines = f"{shown} has {n_lines} line{'' if n_lines == 1 else 's'}"
        if not 1 <= first <= n_lines:
            raise EditorError(
                f"Invalid `view_range` parameter: {list(view_range)}. Its first element `{first}` should be "
                f"within the range of lines of the file: [1, {n_lines}] ({lines})."
            )
        if last != -1:
            if last < first:
                raise EditorError(
                    f"Invalid `view_range` parameter: {list(view_range)}. Its second element `{last}` should "
                    f"be larger than or equal to its first `{first}`, or -1 for the end of the file."
                )
            if last > n_lines:
                raise EditorError(
                    f"Invalid `view_range` parameter: {list(view_range)}. Its second element `{last}` should "
                    f"be at most the number of lines in the file, {n_lines} ({lines}); use -1 for the end."
                )
        return first, last

    async def _view_dir(self, target: _Target) -> str:
        cmd = f"find {shlex.quote(target.real)} -maxdepth 2 -not -path '*/.*'"
        result = await self.sandbox.exec(cmd, timeout=60.0)
        if result.timed_out or (result.exit_code and not result.stdout):
            detail = "timed out" if result.timed_out else result.stderr.strip()
            raise EditorError(f"Could not list the directory {target.shown}: {detail}")
        entries = sorted(line for line in result.stdout.splitlines() if line)
        if target.real != target.shown:  # shown as the model named it, not as the symlinks resolve
            entries = [target.shown + entry[len(target.real) :] for entry in entries]
        header = (
            f"Here's the files and directories up to 2 levels deep in {target.shown}, "
            "excluding hidden items:\n"
        )
        return self._clip(header + "".join(f"{entry}\n" for entry in entries), DIR_CLIPPED)

    async def _create(self, target: _Target, file_text: Any) -> str:
        if file_text is None:
            raise EditorError("Parameter `file_text` is required for command: create.")
        if not isinstance(file_text, str):
            raise EditorError(f"Parameter `file_text` must be a string, not {type(file_text).__name__}.")
        if target.kind == "dir":
            raise EditorError(
                f"The path {target.shown} is a directory; `create` needs the path of a new file."
            )
        if target.kind != "missing":
            raise EditorError(
                f"File already exists at: {target.shown}. Cannot overwrite files using command `create`; "
                f"use `str_replace` to edit it."
            )
        await self._write(target, file_text.encode("utf-8"))
        self._remember(target, None)
        return f"File created successfully at: {target.shown}"

    async def _str_replace(self, target: _Target, old_str: Any, new_str: Any) -> str:
        self._check_editable(target, "str_replace")
        if old_str is None:
            raise EditorError("Parameter `old_str` is required for command: str_replace.")
        if not isinstance(old_str, str) or (new_str is not None and not isinstance(new_str, str)):
            raise EditorError("Parameters `old_str` and `new_str` must be strings.")
        if old_str == "":
            raise EditorError("Parameter `old_str` must not be empty: give the exact text to replace.")
        new_str = new_str or ""
        data, text = await self._read_text(target, "str_replace")
        starts = _occurrences(text, old_str)
        if not starts:
            raise EditorError(
                f"No replacement was performed, old_str `{old_str}` did not appear verbatim in "
                f"{target.shown}."
            )
        if len(starts) > 1:
            numbers = sorted({text.count("\n", 0, start) + 1 for start in starts})
            raise EditorError(
                f"No replacement was performed. Multiple occurrences of old_str `{old_str}` in lines "
                f"{numbers} ({len(starts)} occurrences). Please ensure it is unique: include more "
                f"surrounding lines."
            )
        if old_str == new_str:
            raise EditorError("No replacement was performed: `new_str` and `old_str` are the same.")
        start = starts[0]
        new_text = text[:start] + new_str + text[start + len(old_str) :]
        await self._write(target, new_text.encode("utf-8"))
        self._remember(target, data)
        line = text.count("\n", 0, start)  # 0-based line where the replacement starts
        return self._edited(target, new_text, line, new_str.count("\n") + 1, "")

    async def _insert(self, target: _Target, new_str: Any, insert_line: Any) -> str:
        self._check_editable(target, "insert")
        if insert_line is None:
            raise EditorError("Parameter `insert_line` is required for command: insert.")
        if new_str is None:
            raise EditorError("Parameter `new_str` is required for command: insert.")
        if not _is_int(insert_line):
            raise EditorError(f"Parameter `insert_line` must be an integer, not {insert_line!r}.")
        if not isinstance(new_str, str):
            raise EditorError(f"Parameter `new_str` must be a string, not {type(new_str).__name__}.")
        data, text = await self._read_text(target, "insert")
        lines = _lines(text)
        if not 0 <= insert_line <= len(lines):
            raise EditorError(
                f"Invalid `insert_line` parameter: {insert_line}. It should be within the range of lines "
                f"of the file: [0, {len(lines)}] (0 inserts at the top, {len(lines)} at the end)."
            )
        block = new_str if new_str.endswith("\n") else new_str + "\n"
        if insert_line == len(lines) and text and not text.endswith("\n"):
            # after a last line without a newline: keep the file without a trailing newline
            new_text = text + "\n" + block[:-1]
        else:
            offset = 0
            for line in lines[:insert_line]:
                offset += len(line) + 1
            new_text = text[:offset] + block + text[offset:]
        await self._write(target, new_text.encode("utf-8"))
        self._remember(target, data)
        return self._edited(
            target,
            new_text,
            insert_line,
            block.count("\n"),
            " (correct indentation, no duplicate lines, etc)",
        )

    async def _undo(self, target: _Target) -> str:
        history = self._history.get(target.real)
        if not history:
            raise EditorError(f"No edit history found for {target.shown}: there is no edit to undo.")
        previous = history.pop()
        if not history:
            del self._history[target.real]
        if previous is None:
            result = await self.sandbox.exec(f"rm -f -- {shlex.quote(target.real)}", timeout=30.0)
            if not result.ok:
                self._remember(target, previous)
                raise EditorError(f"Could not remove {target.shown}: {result.stderr.strip()}")
            return f"Last edit to {target.shown} undone successfully: the file it created was removed."
        try:
            await self._write(target, previous)
        except EditorError:
            self._remember(target, previous)
            raise
        text = previous.decode("utf-8", errors="replace")
        listing = f"Here's the result of running `cat -n` on {target.shown}:\n{_numbered(_lines(text), 1)}"
        return self._clip(f"Last edit to {target.shown} undone successfully. {listing}", FILE_CLIPPED)

    # --- helpers --------------------------------------------------------------------------------

    @staticmethod
    def _check_editable(target: _Target, command: str) -> None:
        if target.kind == "missing":
            raise EditorError(f"The path {target.shown} does not exist. Please provide a valid path.")
        if target.kind == "dir":
            raise EditorError(
                f"The path {target.shown} is a directory and only the `view` command can be used on "
                f"directories; `{command}` needs a file."
            )
        if target.kind != "file":
            raise EditorError(f"The path {target.shown} is not a regular file; `{command}` needs a file.")

    async def _read(self, target: _Target) -> bytes:
        if target.kind != "file":
            raise EditorError(f"The path {target.shown} is not a regular file.")
        try:
            return await self.sandbox.read_file(target.real)
        except _INFRASTRUCTURE_ERRORS:
            raise
        except SandboxError as exc:
            raise EditorError(f"Could not read {target.shown}: {exc}") from None

    async def _read_text(self, target: _Target, command: str) -> tuple[bytes, str]:
        data = await self._read(target)
        try:
            return data, data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EditorError(
                f"{target.shown} is not UTF-8 text (undecodable byte at offset {exc.start}); `{command}` "
                f"only edits text files. Change binary files with the shell instead."
            ) from None

    async def _write(self, target: _Target, data: bytes) -> None:
        try:
            await self.sandbox.write_file(target.real, data)
        except _INFRASTRUCTURE_ERRORS:
            raise
        except SandboxError as exc:
            raise EditorError(f"Could not write {target.shown}: {exc}") from None

    def _remember(self, target: _Target, previous: bytes | None) -> None:
        self._history.setdefault(target.real, deque(maxlen=HISTORY_DEPTH)).append(previous)

    def _edited(self, target: _Target, new_text: str, line: int, n_new: int, advice: str) -> str:
        """The observation after an edit: the edited lines (0-based ``line``, ``n_new`` of them) with
        ``SNIPPET_LINES`` of context each side, numbered."""
        lines = _lines(new_text)
        start = max(0, line - SNIPPET_LINES)
        end = min(len(lines), line + n_new + SNIPPET_LINES)
        snippet = _numbered(lines[start:end], start + 1)
        review = EDIT_REVIEW.format(advice=advice)
        text = (
            f"The file {target.shown} has been edited. Here's the result of running `cat -n` on a snippet "
            f"of {target.shown}:\n{snippet}{review}"
        )
        return self._clip(text, OUTPUT_CLIPPED)

    def _clip(self, text: str, note: str) -> str:
        """``text`` cut to ``max_output_chars`` (at a line end where one is near) with ``note``."""
        if len(text) <= self.max_output_chars:
            return text
        cut = text[: self.max_output_chars]
        newline = cut.rfind("\n")
        if newline >= self.max_output_chars // 2:
            cut = cut[: newline + 1]
        elif not cut.endswith("\n"):
            cut += "\n"
        return cut + note.format(limit=self.max_output_chars)


class _Target:
    """A path of a tool call: as shown to the model, as resolved in the sandbox, and what is there."""

    __slots__ = ("kind", "real", "shown")

    def __init__(self, shown: str, real: str, kind: str) -> None:
        self.shown, self.real, self.kind = shown, real, kind


def _occurrences(text: str, needle: str) -> list[int]:
    """Start offsets of every (possibly overlapping) occurrence of ``needle`` in ``text``."""
    starts: list[int] = []
    start = text.find(needle)
    while start != -1:
        starts.append(start)
        start = text.find(needle, start + 1)
    return starts


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
