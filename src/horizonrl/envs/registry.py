"""Find envs by name: the built-in ones, ones registered in code, and third-party packages that
declare an entry point in the ``horizonrl.envs`` group::

    [project.entry-points."horizonrl.envs"]
    my_env = "my_package.envs:MyEnv"

An env can also be named by its import path, ``module:Class`` (e.g. ``my_package.envs:MyEnv``),
without registering it: the module is imported and ``Class`` (a dotted attribute path) must be an
Env subclass. Every function here that takes an env name takes such a spec too.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from importlib.metadata import entry_points
from typing import Any

from pydantic import ValidationError

from horizonrl.envs.base import Env, EnvOptions
from horizonrl.errors import ConfigError, UnknownEnvError

ENTRY_POINT_GROUP = "horizonrl.envs"
_BUILTIN_MODULES = (
    "horizonrl.envs.api.bfcl",
    "horizonrl.envs.api.flights",
    "horizonrl.envs.calc",
    "horizonrl.envs.latency",
    "horizonrl.envs.shell",
    "horizonrl.envs.swe.env",
    "horizonrl.worlds.env",
)
_REGISTRY: dict[str, type[Env]] = {}
_BROKEN: dict[str, str] = {}  # entry points that failed to load, with why
_discovered = False


def register_env(cls: type[Env]) -> type[Env]:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    if not cls.name:
        raise TypeError(f"{cls.__qualname__} needs a class attribute `name` to be registered")
    _REGISTRY[cls.name] = cls
    return cls


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTRY:
            continue
        try:
            cls = ep.load()
        except Exception as exc:  # a broken plugin must not hide the working envs
            _BROKEN[ep.name] = f"{ep.value}: {type(exc).__name__}: {exc}"
            continue
        if not (isinstance(cls, type) and issubclass(cls, Env)):
            _BROKEN[ep.name] = f"{ep.value} is not an Env subclass"
            continue
        _REGISTRY[ep.name] = cls


def list_envs() -> dict[str, type[Env]]:
    """All registered envs, by name."""
    _discover()
    return dict(sorted(_REGISTRY.items()))


def get_env_class(name: str) -> type[Env]:
    """The Env class registered as ``name``, or named by ``module:Class``; UnknownEnvError (one
    line) names the valid choices."""
    _discover()
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in _BROKEN:
        raise UnknownEnvError(f"env {name!r} is declared by a plugin but failed to load: {_BROKEN[name]}")
    if ":" in name:
        return _import_env(name)
    valid = ", ".join(sorted(_REGISTRY)) or "(none)"
    close = difflib.get_close_matches(name, _REGISTRY, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownEnvError(
        f"unknown env {name!r}.{hint} Registered envs: {valid}; or give module:Class of an Env subclass."
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _import_env(spec: str) -> type[Env]:
    """The Env subclass that ``spec`` (``module:Class``) names; UnknownEnvError says what is wrong."""
    module_name, _, attr = spec.partition(":")
    valid = (
        f"give a registered name ({', '.join(sorted(_REGISTRY)) or 'none'}) "
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
