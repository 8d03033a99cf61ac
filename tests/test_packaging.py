"""pyproject.toml declares what the code needs and nothing else."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: declared dependencies the code needs without importing them by name
USED_WITHOUT_IMPORT = {
    "gguf": "transformers reads the embedded model's GGUF file with it",
    "tensorboard": "torch.utils.tensorboard writes the run's event files with it",
}
IMPORT_NAMES = {"pyyaml": "yaml"}


def _declared() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]]


def test_every_declared_dependency_is_used() -> None:
    source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "src").rglob("*.py"))
    unused = []
    for dist in _declared():
        if dist in USED_WITHOUT_IMPORT:
            continue
        module = IMPORT_NAMES.get(dist, dist.replace("-", "_"))
        if not re.search(rf"^\s*(?:import|from) {re.escape(module)}\b", source, re.M):
            unused.append(dist)
    assert not unused, f"declared in pyproject.toml but never imported: {', '.join(unused)}"


def test_transformers_has_an_upper_bound() -> None:
    """The engine builds on transformers internals, so the tested range is pinned from above."""
    spec = next(
        d
        for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
        if d.startswith("transformers")
    )
    assert "<" in spec, spec
