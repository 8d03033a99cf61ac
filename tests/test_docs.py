"""The user docs say only what is true of this tree: every file, module and `horizon` command they
name exists, every link lands, and the README's quickstart commands parse.

The commands are parsed by the real CLI (typer/click) without running them, so a renamed verb or
option fails here instead of in a user's shell."""

from __future__ import annotations

import ast
import importlib
import re
import shlex
import subprocess
from functools import cache
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup
from typer.exceptions import TyperException
from typer.main import get_command

from horizonrl.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
_CODE = re.compile(r"`([^`\n]+)`")
_MODULE = re.compile(r"^horizonrl(?:\.\w+)+$")
_ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")


def _doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return _FENCE.sub("", text)


@cache
def _tracked() -> tuple[frozenset[str], frozenset[str]]:
    """The files git tracks (or would: untracked but not ignored), and their parent directories."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    files = frozenset(out)
    dirs = frozenset(str(parent) for f in out for parent in Path(f).parents if str(parent) != ".")
    return files, dirs


def _names_a_tracked_path(token: str) -> bool:
    """``token`` (``envs/calc.py``, ``train/``, ``decoder.py``) is the tail of a file or directory
    of the tree: docs name modules relative to ``src/horizonrl`` or to the section they describe."""
    files, dirs = _tracked()
    token = token.rstrip("/")
    if "/" not in token:
        return any(Path(f).name == token for f in files) or any(Path(d).name == token for d in dirs)
    return any(p == token or p.endswith("/" + token) for p in files | dirs)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", _prose(text), re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_links_land(doc: Path) -> None:
    """Every relative link and image points at a file that exists, and a #fragment at a heading."""
    text = doc.read_text(encoding="utf-8")
    broken = []
    for target in _LINK.findall(text) + _IMAGE.findall(text):
        if re.match(r"^[a-z]+:", target):  # http(s), mailto: not checked offline
            continue
        path_part, _, fragment = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.name}")
    assert not broken, f"{_doc_id(doc)}: " + "; ".join(broken)


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_named_files_exist(doc: Path) -> None:
    """A file or directory named in backticks (``envs/calc.py``, ``benchmarks/learning.py``) is in
    the tree. Paths a run creates (``runs/...``) and placeholders are not checked."""
    missing = []
    for token in _CODE.findall(_prose(doc.read_text(encoding="utf-8"))):
        token = token.strip()
        if " " in token or token.startswith(("runs/", "/", "~", "$", ".", "output_dir")):
            continue
        if not re.fullmatch(r"[\w./-]+", token):
            continue
        has_suffix = Path(token).suffix != "" or token.endswith("/")
        looks_like_source = token.endswith((".py", ".md")) or (
            has_suffix and "/" in token and token.split("/")[0] in _top_level_names()
        )
        if looks_like_source and not _names_a_tracked_path(token):
            missing.append(token)
    assert not missing, f"{_doc_id(doc)} names files that do not exist: {', '.join(sorted(set(missing)))}"


@cache
def _top_level_names() -> frozenset[str]:
    """Directories a doc may name a path under: the repo's own and the package's subpackages."""
    names = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    names |= {p.name for p in (ROOT / "src" / "horizonrl").iterdir() if p.is_dir()}
    return frozenset(names - {"runs", "build", "__pycache__"})


def _resolve(dotted: str) -> object:
    """Import the longest importable module prefix of ``dotted`` and get the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_named_modules_exist(doc: Path) -> None:
    """``horizonrl.x.y`` (a module, or a module's class or function) imports."""
    text = doc.read_text(encoding="utf-8")
    missing = []
    for token in set(_CODE.findall(text)):
        token = token.strip().rstrip("()")
        if not _MODULE.match(token):
            continue
        try:
            _resolve(token)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{token} ({type(exc).__name__}: {exc})")
    assert not missing, f"{_doc_id(doc)}: " + "; ".join(missing)


def _horizon_commands(text: str) -> list[str]:
    """Command lines (``horizon ...``) in the doc's shell code blocks, comments and env prefixes cut."""
    lines = []
    for lang, body in _FENCE.findall(text):
        if lang not in ("bash", "sh", "shell", "console", ""):
            continue
        for raw in body.replace("\\\n", " ").splitlines():
            line = raw.strip().removeprefix("$ ")
            if not re.match(r"^([A-Z_][A-Z0-9_]*=\S*\s+)*horizon\b", line):
                continue
            words = shlex.split(line, comments=True)
            while words and _ENV_ASSIGNMENT.match(words[0]):
                words = words[1:]
            if words and words[0] == "horizon":
                lines.append(shlex.join(words))
    return lines


def _parse(argv: list[str]) -> typer.Context:
    """Parse ``horizon ARGV`` the way the CLI would, down to the leaf command, without running it;
    the leaf's context (``.command``, ``.params``). tests/test_deploy.py parses deploy/'s commands.
    typer vendors its own click: its groups are TyperGroups, its errors TyperExceptions (the
    ``click`` package's classes match neither)."""
    command = get_command(app)
    ctx = command.make_context("horizon", list(argv))
    while isinstance(command, TyperGroup):
        args = [*ctx._protected_args, *ctx.args]
        if not args:
            raise typer.BadParameter("a group named without a command")
        _name, sub, rest = command.resolve_command(ctx, args)
        assert sub is not None
        command, ctx = sub, sub.make_context(sub.name, rest, parent=ctx)
    return ctx


COMMAND_DOCS = [d for d in DOCS if _horizon_commands(d.read_text(encoding="utf-8"))]


@pytest.mark.parametrize("doc", COMMAND_DOCS, ids=_doc_id)
def test_horizon_commands_parse(doc: Path) -> None:
    """Every ``horizon ...`` line in a doc's shell blocks names real verbs and options."""
    bad = []
    for line in _horizon_commands(doc.read_text(encoding="utf-8")):
        try:
            _parse(shlex.split(line)[1:])
        except typer.Exit:  # --help
            pass
        except TyperException as exc:
            bad.append(f"{line!r}: {exc.format_message()}")
    assert not bad, f"{_doc_id(doc)}: " + "; ".join(bad)


def test_readme_has_the_quickstart_commands() -> None:
    """The README leads with the two commands, and both are Makefile targets."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("demo", "test"):
        assert f"make {target}" in text
        assert re.search(rf"^{target}:", makefile, re.M), f"Makefile has no {target} target"
    assert len(_horizon_commands(text)) >= 5, "the README's quickstart shows the horizon commands"


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_python_snippets_import(doc: Path) -> None:
    """Python code blocks compile and every name they import from horizonrl exists."""
    bad = []
    for lang, body in _FENCE.findall(doc.read_text(encoding="utf-8")):
        if lang != "python":
            continue
        try:
            tree = ast.parse(body)
        except SyntaxError as exc:
            bad.append(f"does not compile: {exc}")
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("horizonrl"):
                for alias in node.names:
                    try:
                        _resolve(f"{node.module}.{alias.name}")
                    except (ImportError, AttributeError) as exc:
                        bad.append(f"from {node.module} import {alias.name}: {exc}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("horizonrl"):
                        try:
                            importlib.import_module(alias.name)
                        except ImportError as exc:
                            bad.append(f"import {alias.name}: {exc}")
    assert not bad, f"{_doc_id(doc)}: " + "; ".join(bad)


def test_user_docs_carry_no_tracker_or_run_names() -> None:
    """User docs speak of features, not of issue numbers or internal run letters."""
    tracker = re.compile(r"\bissue #?\d+|\bstop \d+\b", re.I)
    run_letter = re.compile(r"\b[Rr]uns? [A-Z]\b(?![.'])")
    hits = [
        f"{_doc_id(d)}:{n}: {line.strip()[:80]}"
        for d in [*DOCS, *sorted((ROOT / "configs").glob("*.yaml"))]
        for n, line in enumerate(d.read_text(encoding="utf-8").splitlines(), 1)
        if tracker.search(line) or run_letter.search(line)
    ]
    assert not hits, "; ".join(hits)
