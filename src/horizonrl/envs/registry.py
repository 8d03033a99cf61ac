"""Find envs by name. Every env, the built-in ones included, is declared by an entry point in the
``horizonrl.envs`` group of its package's metadata (ours in ``pyproject.toml``)::

    [project.entry-points."horizonrl.envs"]
    my_env = "my_package.envs:MyEnv"

and loaded when it is first asked for (a broken plugin fails with one line only when named). Code
can also register a class for the running process (:func:`register_env`, e.g. in a notebook or a
test), which takes precedence over an entry point of the same name. An env can also be named by its
import path, ``module:Class`` (e.g. ``my_package.envs:MyEnv``), without registering it: the module
is imported and ``Class`` (a dotted attribute path) must be an Env subclass. Every function here that
takes an env name takes such a spec too.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from pydantic import ValidationError

from horizonrl.envs.base import Env, EnvOptions
from horizonrl.envs.foreign import FRAMEWORKS, foreign_env_class, is_foreign
from horizonrl.errors import ConfigError, UnknownEnvError

ENTRY_POINT_GROUP = "horizonrl.envs"
_OWN_DISTRIBUTION = "horizonrl"
_REGISTRY: dict[str, type[Env]] = {}  # registered in code, or loaded from an entry point
_BROKEN: dict[str, str] = {}  # entry points that failed to load, with why


def register_env(cls: type[Env]) -> type[Env]:
    """Make ``cls`` available under ``cls.name`` in this process (also usable as a decorator)."""
    if not cls.name:
        raise TypeError(f"{cls.__qualname__} needs a class attribute `name` to be registered")
    _REGISTRY[cls.name] = cls
    return cls


@functools.cache
def _declared() -> dict[str, EntryPoint]:
    """The envs declared by installed packages, by name; where two packages declare one name, ours
    wins (a plugin cannot shadow a built-in env)."""
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        own = ep.dist is not None and ep.dist.name == _OWN_DISTRIBUTION
        if ep.name not in found or own:
            found[ep.name] = ep
    return found


def _load(name: str) -> type[Env] | None:
    """The env ``name`` from the registry or its entry point (loaded once); None when neither has it
    or its entry point failed to load (why is kept in ``_BROKEN``)."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    ep = _declared().get(name)
    if ep is None or name in _BROKEN:
        return None
    try:
        cls = ep.load()
    except Exception as exc:  # a broken plugin must not hide the working envs
        _BROKEN[name] = f"{ep.value}: {type(exc).__name__}: {exc}"
        return None
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        _BROKEN[name] = f"{ep.value} is not an Env subclass"
        return None
    _REGISTRY[name] = cls
    return cls


def _known_names() -> list[str]:
    return sorted((set(_REGISTRY) | set(_declared())) - set(_BROKEN))


def registered_env_class(name: str) -> type[Env] | None:
    """The env registered (in code or by an entry point) as ``name``, or None; never imports a module
    a ``module:Class`` name points at, so it is what a data file (a task line's ``env``) may name."""
    return _load(name)


def list_envs() -> dict[str, type[Env]]:
    """All envs that load, by name (every declared one is loaded)."""
    loaded = {name: _load(name) for name in sorted(set(_REGISTRY) | set(_declared()))}
    return {name: cls for name, cls in loaded.items() if cls is not None}


def get_env_class(name: str) -> type[Env]:
    """The Env class registered as ``name``, or named by ``module:Class``; UnknownEnvError (one
    line) names the valid choices."""
    cls = _load(name)
    if cls is not None:
        return cls
    if name in _BROKEN:
        raise UnknownEnvError(f"env {name!r} is declared by a plugin but failed to load: {_BROKEN[name]}")
    if is_foreign(name):
        return foreign_env_class(name)
    if ":" in name:
        return _import_env(name)
    known = _known_names()
    valid = ", ".join(known) or "(none: is horizonrl installed? pip install -e .)"
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownEnvError(
        f"unknown env {name!r}.{hint} Registered envs: {valid}; or give module:Class of an Env subclass."
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _import_env(spec: str) -> type[Env]:
    """The Env subclass that ``spec`` (``module:Class``) names; UnknownEnvError says what is wrong."""
    module_name, _, attr = spec.partition(":")
    frameworks = f"<framework>:<env id> of another framework ({', '.join(FRAMEWORKS)})"
    valid = (
        f"give a registered name ({', '.join(_known_names()) or 'none'}), {frameworks} "
        "or module:Class of an Env subclass"
    )
    if not module_name.strip() or not attr.strip() or ":" in attr:
        raise UnknownEnvError(f"env {spec!r}: expected exactly one module:Class; {valid}")
    try:
        obj: object = importlib.import_module(module_name)
    except Exception as exc:  # any failure to import is the spec's problem, reported in one line
        why = _one_line(f"{type(exc).__name__}: {exc}")
        raise UnknownEnvError(
            f"env {spec!r}: module {module_name!r} does not import ({why}); {valid}"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UnknownEnvError(f"env {spec!r}: module {module_name!r} has no attribute {attr!r}; {valid}")
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, Env)):
        what = f"class {obj.__qualname__}" if isinstance(obj, type) else f"a {type(obj).__name__}"
        raise UnknownEnvError(f"env {spec!r}: {attr!r} is {what}, not an Env subclass; {valid}")
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
        raise UnknownEnvError(f"env {spec!r}: {attr!r} is abstract (does not implement {missing}); {valid}")
    return obj


def parse_env_options(name: str, options: dict[str, Any]) -> EnvOptions:
    """Validate ``options`` against the env's Options model; ConfigError names the bad key."""
    cls = get_env_class(name)
    try:
        return cls.Options.model_validate(options)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        valid = ", ".join(cls.Options.model_fields) or "(none)"
        raise ConfigError(
            f"env.options.{key}: {err['msg']} (env {name!r} accepts options: {valid})"
        ) from None


def make_env(name: str, options: dict[str, Any] | EnvOptions | None = None) -> Env:
    """Instantiate the env ``name`` (a registered name or ``module:Class``) with validated options:
    a dict is validated against the env's Options model, a model instance must be one."""
    cls = get_env_class(name)
    if not isinstance(options, EnvOptions):
        options = parse_env_options(name, options or {})
    elif not isinstance(options, cls.Options):
        raise TypeError(f"env {name!r} takes {cls.Options.__name__} options, got {type(options).__name__}")
    return cls(options)
