"""Environments: the Env contract, tools, the registry and the built-in envs."""

from horizonrl.envs.base import Env, EnvOptions, ToolEnv, ToolResult
from horizonrl.envs.registry import get_env_class, list_envs, make_env, register_env
from horizonrl.envs.tools import tool

__all__ = [
    "Env",
    "EnvOptions",
    "ToolEnv",
    "ToolResult",
    "get_env_class",
    "list_envs",
    "make_env",
    "register_env",
    "tool",
]
