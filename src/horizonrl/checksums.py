"""sha256 manifests of files on disk: what checkpoints and policy directories record and check."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path) -> str:
    """The sha256 hex digest of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def file_digests(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``folder``, in path order."""
    return {
        f.relative_to(folder).as_posix(): sha256_file(f) for f in sorted(folder.rglob("*")) if f.is_file()
    }


def first_problem(folder: Path, files: dict[str, str]) -> str | None:
    """What is wrong with the files a manifest lists under ``folder`` (the first problem, in path
    order: a name outside the folder, a missing file, a checksum that does not match), or None."""
    for rel, expected in sorted(files.items()):
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            return f"the manifest lists an invalid file name {rel!r}"
        file = Path(folder) / rel
        if not file.is_file():
            return f"file {rel} is missing"
        if sha256_file(file) != expected:
            return f"file {rel} is corrupt or truncated (checksum mismatch)"
    return None
