"""``horizon roles``: which backend serves each LLM role, and a message to one of them."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import typer

from horizonrl.cli.common import CheckpointOpt, ConfigArg, OverridesArg, console, say, user_errors


@user_errors
def roles(
    config_path: ConfigArg,
    overrides: OverridesArg = None,
    role: Annotated[str | None, typer.Option(help="The role to send --message to (e.g. judge).")] = None,
    message: Annotated[
        str | None, typer.Option(help="A user message for --role; its reply is printed.")
    ] = None,
    checkpoint: CheckpointOpt = None,
) -> None:
    """Show which backend serves each LLM role (the recipe's roles block); with --role and
    --message, ask that role and print its reply."""
    from horizonrl.config import load_config
    from horizonrl.errors import ConfigError
    from horizonrl.roles import ROLE_NAMES, Roles

    config = load_config(config_path, overrides)
    if (role is None) != (message is None):
        raise ConfigError(
            "--role and --message go together: horizon roles CONFIG --role judge --message 'Hi'"
        )
    if role is not None and role not in ROLE_NAMES:
        raise ConfigError(f"--role {role!r} is not a role; roles: {', '.join(ROLE_NAMES)}")
    if role is None:
        for name, where in Roles(config.roles).describe().items():
            say(f"{name:12} {where}")
        return
    engine = tokenizer = None
    if config.roles.for_role(role).backend == "policy":
        from horizonrl.train.runtime import build_runtime

        with console.status("loading the policy…"):
            runtime = build_runtime(config, checkpoint=checkpoint)
        engine, tokenizer = runtime.engine, runtime.tokenizer
    client = Roles(config.roles, engine, tokenizer).get(role)
    start = time.perf_counter()
    reply = asyncio.run(client.chat([{"role": "user", "content": message}]))
    say(reply)
    say(f"({role}: {time.perf_counter() - start:.1f} s)")
