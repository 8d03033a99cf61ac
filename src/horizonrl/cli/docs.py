"""docs/config.md, generated: every section and key of a recipe (type, bounds, default, description),
the ``train.algorithm`` presets, and every ``horizon`` command with its arguments and options.

The page keeps whatever is written above :data:`MARKER` (a hand-written introduction) and replaces
everything below it with :func:`render_reference`; ``horizon config docs --out docs/config.md``
rewrites it and ``tests/test_config_docs.py`` fails when the committed page differs. The commands
are read from the ``horizon`` app's click command, handed in by the caller (the running command's
root, or ``typer.main.get_command(app)``).
"""

from __future__ import annotations

import inspect
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from horizonrl.config import (
    ALGORITHM_PRESETS,
    DEFAULT_ALGORITHM,
    PRESET_FIELDS,
    RunConfig,
    format_value,
)

REGENERATE = "horizon config docs --out docs/config.md"
MARKER = (
    f"<!-- Generated below this line by `{REGENERATE}` from the config models and the commands: "
    "edit those, not this part. -->"
)
_INTRO = "# Configuration and the command line\n\n"

_BOUNDS = (
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Ge, "ge", "≥"),
    (annotated_types.Lt, "lt", "<"),
    (annotated_types.Le, "le", "≤"),
)


def _cell(text: str) -> str:
    """``text`` as one markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{text}`" if "`" not in text else f"`` {text} ``"


def type_text(annotation: Any) -> str:
    """A readable name of a field's type: ``int``, ``float or null``, ``grpo, rloo or gae``."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return type_text(args[0])
    if origin is Literal:
        values = [format_value(a) for a in args]
        return "one of " + ", ".join(values) if len(values) > 1 else values[0]
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else type_text(a) for a in args)
    if origin in (list, tuple, set, frozenset):
        inner = [a for a in args if a is not Ellipsis]
        return f"list of {type_text(inner[0])}" if inner else "list"
    if origin is dict or annotation is dict:
        return "mapping"
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return "section"
    names = {str: "string", int: "int", float: "float", bool: "bool"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)).lower())


def bounds_text(field: FieldInfo) -> str:
    """The field's numeric bounds, e.g. ``≥ 1`` or ``> 0, ≤ 1``."""
    found = []
    for meta in field.metadata:
        for kind, attr, sign in _BOUNDS:
            if isinstance(meta, kind):
                found.append(f"{sign} {format_value(getattr(meta, attr))}")
    return ", ".join(found)


def _sections(model: type[BaseModel], prefix: str = "") -> list[tuple[str, type[BaseModel]]]:
    """``model`` and every section nested in it, depth first, each with its dotted name."""
    found = [(prefix, model)]
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
            found += _sections(annotation, f"{prefix}.{name}" if prefix else name)
    return found


def _doc(obj: Any) -> str:
    return " ".join(inspect.cleandoc(obj.__doc__ or "").split())


def _section_table(name: str, model: type[BaseModel]) -> list[str]:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, field in model.model_fields.items():
        annotation = field.annotation
        shown = f"{name}.{key}" if name else key
        if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
            anchor = shown.replace(".", "")
            default = f"see [{shown}](#{anchor})"
        elif field.is_required():
            default = "required"
        else:
            default = _code(format_value(field.get_default(call_default_factory=True)))
        if name == "train" and key in PRESET_FIELDS:
            default += f" ({DEFAULT_ALGORITHM} preset)"
        kind = type_text(annotation)
        bounds = bounds_text(field)
        kind = f"{kind}, {bounds}" if bounds else kind
        description = field.description or ""
        if not description and inspect.isclass(annotation) and issubclass(annotation, BaseModel):
            description = _doc(annotation)
        lines.append(f"| {_code(key)} | {_cell(kind)} | {_cell(default)} | {_cell(description)} |")
    return lines


def _presets_table() -> list[str]:
    fields = list(PRESET_FIELDS)
    lines = [
        "| `train.algorithm` | " + " | ".join(_code(f) for f in fields) + " | about |",
        "|---" * (len(fields) + 2) + "|",
    ]
    for name, preset in ALGORITHM_PRESETS.items():
        values = preset.values()
        label = _code(name) + (" (default)" if name == DEFAULT_ALGORITHM else "")
        cells = [_code(format_value(values[f])) for f in fields]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {_cell(preset.about)} |")
    return lines


def _is_argument(param: Any) -> bool:
    return param.param_type_name == "argument"


def _metavar(param: Any) -> str:
    return param.metavar or param.name.upper()


def _param_type(param: Any) -> str:
    descriptor = getattr(param, "type_descriptor", None)  # typer >= 0.29
    if descriptor is not None:
        return type_text(descriptor.annotation)
    return str(param.type.name)


def _is_group(command: Any) -> bool:
    return hasattr(command, "list_commands")


def _param_row(param: Any) -> str:
    """One row of a command's table. (Commands are typer's click objects; typer 0.29 vendors its own
    click, so they are told apart by their attributes, not by click's classes.)"""
    if _is_argument(param):
        shown = _metavar(param) + ("..." if param.nargs == -1 else "")
        kind = f"argument: {_param_type(param)}" + ("" if param.required else ", optional")
        default = ""
    else:
        shown = ", ".join([*param.opts, *param.secondary_opts])
        kind = "flag" if param.is_flag else _param_type(param)
        default = ""
        if not param.is_flag and param.default is not None:
            default = _code(format_value(param.default))
        if param.envvar:
            envvars = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar)
            default = ", ".join([default, *(f"env {_code('$' + e)}" for e in envvars)]).strip(", ")
    help_text = getattr(param, "help", None) or ""
    return f"| {_code(shown)} | {_cell(kind)} | {_cell(default)} | {_cell(help_text)} |"


def _commands(group: Any, ctx: Any, prefix: str) -> list[tuple[str, Any]]:
    found = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        path = f"{prefix} {name}"
        if _is_group(command):
            found += _commands(command, ctx, path)
        else:
            found.append((path, command))
    return found


def _command_docs(app_command: Any) -> list[str]:
    ctx = app_command.context_class(app_command, info_name="horizon")
    commands = _commands(app_command, ctx, "horizon")
    lines = [
        "## Commands",
        "",
        f"{len(commands)} commands. Exit status 2 and one line on stderr for a user mistake, 130 for "
        "Ctrl-C. CONFIG_PATH is a YAML recipe; OVERRIDES are `key.sub=value` pairs (see above).",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    for path, command in commands:
        summary = command.get_short_help_str(limit=10**6)
        lines.append(f"| [{_code(path)}](#{path.replace(' ', '-')}) | {_cell(summary)} |")
    for path, command in commands:
        pieces = [
            _metavar(p) + ("..." if p.nargs == -1 else "")
            if p.required
            else f"[{_metavar(p)}{'...' if p.nargs == -1 else ''}]"
            for p in command.params
            if _is_argument(p)
        ]
        if any(not _is_argument(p) for p in command.params):
            pieces.append("[OPTIONS]")
        lines += ["", f"### {path}", "", "```text", " ".join([path, *pieces]), "```", ""]
        lines.append(inspect.cleandoc(command.help or ""))
        rows = [_param_row(p) for p in command.params]
        if rows:
            lines += ["", "| argument / option | type | default | description |", "|---|---|---|---|", *rows]
    return lines


def render_reference(app_command: Any) -> str:
    """The generated part of docs/config.md (everything below :data:`MARKER`); ``app_command`` is the
    ``horizon`` app's click command, whose commands it documents."""
    lines = [
        "## Keys",
        "",
        "Every key of a recipe, section by section: its type and bounds, its default and what it "
        "does. A key left out of the recipe takes its default; `horizon config show CONFIG` prints "
        "a recipe resolved, with the source of every value. The env's own options (`env.options`) "
        "depend on `env.name`: `horizon envs` lists them, with their defaults.",
    ]
    for name, model in _sections(RunConfig):
        title = f"`{name}`" if name else "Top level"
        lines += ["", f"### {title}", "", _doc(model), "", *_section_table(name, model)]
        if name == "train":
            lines += [
                "",
                "#### Algorithm presets",
                "",
                "`train.algorithm` gives every key marked (preset) the value in its row; a key the "
                "recipe or an override sets wins (null: the preset's value). See "
                "[algorithms.md](algorithms.md) for what each estimator and loss computes.",
                "",
                *_presets_table(),
            ]
    lines += ["", *_command_docs(app_command)]
    return "\n".join(lines).rstrip() + "\n"


def render_page(current: str | None, app_command: Any) -> str:
    """docs/config.md as it should be: the introduction of ``current`` (the text above the marker;
    a bare title when there is none), the marker, then the reference of ``app_command``."""
    intro = _INTRO
    if current is not None and MARKER in current:
        intro = current.split(MARKER, 1)[0]
    elif current:
        intro = current.rstrip() + "\n\n"
    return f"{intro}{MARKER}\n\n{render_reference(app_command)}"
