"""``horizon envs``: the registered envs, their tools and options, and the envs of the other
frameworks that are installed (``env.name: <framework>:<env id>``)."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from horizonrl.cli.common import console, user_errors


@user_errors
def envs() -> None:
    """List registered envs and their tools, and the installed frameworks' envs."""
    from rich.table import Table

    from horizonrl.envs.foreign import FRAMEWORKS, installed_frameworks
    from horizonrl.envs.registry import list_envs

    table = Table(title="registered envs", show_lines=True)
    table.add_column("env", style="bold")
    table.add_column("tools")
    table.add_column("options")
    for name, cls in list_envs().items():
        tools = "\n".join(
            f"{t.name}({', '.join(t.parameters.get('properties', {}))}): {t.description}"
            for t in cls(cls.Options()).tools
        )
        options = "\n".join(_option_default(k, f) for k, f in cls.Options.model_fields.items())
        table.add_row(Text(name), Text(tools), Text(options or "-"))
    console.print(table)
    found = installed_frameworks()
    foreign = Table(title="other frameworks' envs (env.name: <framework>:<env id>)", show_lines=True)
    foreign.add_column("framework", style="bold")
    foreign.add_column("envs")
    for framework, ids in found.items():
        foreign.add_row(Text(framework), Text("\n".join(ids) or "(none registered)"))
    console.print(foreign)
    missing = [f"{f} (pip install 'horizonrl[{_extra(f)}]')" for f in FRAMEWORKS if f not in found]
    if missing:
        console.print(Text(f"not installed: {', '.join(missing)}"))


def _extra(framework: str) -> str:
    """The pip extra that installs ``framework`` (its adapter says)."""
    import importlib

    from horizonrl.envs.foreign import FRAMEWORKS

    try:
        return str(importlib.import_module(FRAMEWORKS[framework]).EXTRA)
    except Exception:  # an adapter that does not import: its prefix is the best guess
        return framework


def _option_default(key: str, field: Any) -> str:
    """``key = default`` for an env option (a section's defaults as a mapping), or ``key (required)``."""
    if field.is_required():
        return f"{key} (required)"
    default = field.get_default(call_default_factory=True)
    if hasattr(default, "model_dump"):  # a section: its own keys, nested sections folded
        items = default.model_dump(mode="json").items()
        shown = ", ".join(f"{k}: {'{…}' if isinstance(v, dict) else repr(v)}" for k, v in items)
        return f"{key} = {{{shown}}}"
    return f"{key} = {default!r}"
