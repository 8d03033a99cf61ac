"""docs/config.md is generated from the config models and the commands: the committed page is the
one `horizon config docs` writes now (else this fails and says how to regenerate it), and it names
every key of every section, every preset and every command."""

from __future__ import annotations

from pathlib import Path

from typer.main import get_command
from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.cli.docs import MARKER, REGENERATE, render_page, render_reference
from horizonrl.config import ALGORITHM_PRESETS, RunConfig

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "config.md"
runner = CliRunner()


def test_docs_config_md_is_current():
    current = PAGE.read_text(encoding="utf-8")
    assert MARKER in current, f"docs/config.md lost its generated part; regenerate: {REGENERATE}"
    assert current == render_page(current, get_command(app)), (
        f"docs/config.md is stale (the config models or the commands changed); regenerate it with "
        f"`{REGENERATE}` and commit the result"
    )


def _keys(model: type, prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            keys += _keys(annotation, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def test_the_reference_names_every_key_preset_and_command():
    reference = render_reference(get_command(app))
    sections: dict[str, list[str]] = {}
    for key in _keys(RunConfig):
        section, _, name = key.rpartition(".")
        sections.setdefault(section, []).append(name)
    for section, names in sections.items():
        heading = f"### `{section}`" if section else "### Top level"
        assert heading in reference, heading
        table = reference.split(heading, 1)[1].split("\n### ", 1)[0]
        for name in names:
            assert f"| `{name}` |" in table, f"{section}.{name}"
    for algorithm in ALGORITHM_PRESETS:
        assert f"| `{algorithm}`" in reference, algorithm

    def commands(group, ctx, prefix):
        for name in group.list_commands(ctx):
            sub = group.get_command(ctx, name)
            if hasattr(sub, "list_commands"):
                yield from commands(sub, ctx, f"{prefix} {name}")
            else:
                yield f"{prefix} {name}"

    root = get_command(app)
    found = list(commands(root, root.context_class(root, info_name="horizon"), "horizon"))
    assert len(found) >= 14 and "horizon config show" in found
    for command in found:
        assert f"### {command}\n" in reference, command


def test_config_docs_rewrites_only_the_generated_part(tmp_path):
    page = tmp_path / "config.md"
    page.write_text(f"# My intro\n\nhand-written\n\n{MARKER}\n\nold generated text\n", encoding="utf-8")
    result = runner.invoke(app, ["config", "docs", "--out", str(page), "--check"])
    assert result.exit_code == 1 and "stale" in result.stderr
    result = runner.invoke(app, ["config", "docs", "--out", str(page)])
    assert result.exit_code == 0, result.output
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# My intro\n\nhand-written\n\n" + MARKER) and "old generated" not in text
    assert text.endswith(render_reference(get_command(app)))
    result = runner.invoke(app, ["config", "docs", "--out", str(page), "--check"])
    assert result.exit_code == 0 and "up to date" in result.stdout


def test_config_docs_prints_the_reference():
    result = runner.invoke(app, ["config", "docs"])
    assert result.exit_code == 0, result.output
    assert result.stdout == render_reference(get_command(app))
