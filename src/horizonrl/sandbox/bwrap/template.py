"""Templates: the overlay's lower layers a workspace starts from, and the git commit it is diffed
against (a template that is a git repository itself, or a cached layer holding only a ``.git`` whose
one commit is the template's files)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from horizonrl.sandbox.base import SandboxError

_GIT_IDENTITY = [
    "-c",
    "user.name=horizonrl",
    "-c",
    "user.email=horizonrl@localhost",
    "-c",
    "commit.gpgsign=false",
    "-c",
    "core.autocrlf=false",
]
_GIT_DATE = "2000-01-01T00:00:00+0000"


class Template:
    """The overlay's lower layers for one template and the commit the workspace starts at."""

    def __init__(self, name: str | None, lowers: list[Path], base: str) -> None:
        self.name, self.lowers, self.base = name, lowers, base


def _git(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    full_env = {**os.environ, "GIT_AUTHOR_DATE": _GIT_DATE, "GIT_COMMITTER_DATE": _GIT_DATE, **(env or {})}
    done = subprocess.run(
        ["git", *_GIT_IDENTITY, *args], cwd=cwd, env=full_env, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise SandboxError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def _fingerprint(root: Path) -> str:
    """A digest of a directory tree's names, sizes and modification times (not contents)."""
    digest = hashlib.sha256(str(root).encode())
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath, name)
            with contextlib.suppress(OSError):
                st = path.lstat()
                digest.update(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:24]


def _git_layer(cache_dir: Path, key: str, work_tree: Path | None) -> Path:
    """A cached directory holding only ``.git``: a repository whose one commit is ``work_tree``'s
    files (or an empty commit). Built once per key, atomically (concurrent builders race harmlessly)."""
    layer = cache_dir / key
    if (layer / ".git" / "HEAD").exists():
        return layer
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_dir))
    try:
        _git("init", "-q", "-b", "main", str(tmp))
        env = {"GIT_DIR": str(tmp / ".git"), "GIT_WORK_TREE": str(work_tree or tmp)}
        if work_tree is not None:
            _git("add", "-A", env=env)
        _git("commit", "-q", "--allow-empty", "-m", "workspace template", env=env)
        try:
            tmp.rename(layer)
        except OSError:  # another process built it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return layer


def prepare_template(template: str | os.PathLike[str] | None, cache_dir: Path) -> Template:
    """The lower layers and base commit of a workspace seeded from ``template`` (None: empty).

    A template that is a git repository itself is used as is (its HEAD is the base commit, so
    uncommitted changes in it show up in ``diff``); any other directory gets a cached git layer
    keyed by its path, names, sizes and mtimes. Templates must not change while sandboxes use them.
    """
    if template is None:
        layer = _git_layer(cache_dir, "empty", None)
        return Template(None, [layer], _git("rev-parse", "HEAD", cwd=layer))
    root = Path(template).expanduser().resolve()
    if not root.is_dir():
        raise SandboxError(f"sandbox template {str(template)!r} is not a directory")
    bad = {",", ":", "\\"} & set(str(root))
    if bad:
        raise SandboxError(f"sandbox template path {str(root)!r} must not contain {' '.join(sorted(bad))}")
    if (root / ".git").exists():
        return Template(str(root), [root], _git("rev-parse", "HEAD", cwd=root))
    layer = _git_layer(cache_dir, _fingerprint(root), root)
    return Template(str(root), [layer, root], _git("rev-parse", "HEAD", cwd=layer))
