"""``horizon serve``: the policy behind an OpenAI-compatible HTTP API."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from horizonrl.cli.common import (
    AllowedHostOpt,
    CheckpointOpt,
    ConfigArg,
    OverridesArg,
    allowed_host_options,
    check_port_free,
    check_range,
    say,
    user_errors,
)
from horizonrl.errors import ConfigError


@user_errors
def serve(
    config_path: ConfigArg,
    overrides: OverridesArg = None,
    checkpoint: CheckpointOpt = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="HORIZON_SERVE_TOKEN",
            help="Bearer token clients must send (the openai client's api_key); none: no check.",
            show_default=False,
        ),
    ] = None,
    model_name: Annotated[
        str | None, typer.Option(help="The model id clients name (default: the recipe's name).")
    ] = None,
    max_request_mib: Annotated[int, typer.Option(help="Largest request body; bigger gets HTTP 413.")] = 16,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    checkpoint_root: Annotated[
        list[Path] | None,
        typer.Option(
            help="Directory POST /v1/horizon/weights and /v1/load_lora_adapter may load from (repeatable), "
            "besides the recipe's output_dir and --checkpoint.",
            show_default=False,
        ),
    ] = None,
    allow_weight_swaps_without_token: Annotated[
        bool,
        typer.Option(
            "--allow-weight-swaps-without-token",
            help="Let POST /v1/horizon/weights swap weights, and LoRA adapters load and unload, without "
            "--token (a loopback --host only).",
        ),
    ] = False,
    allowed_host: AllowedHostOpt = None,
    max_loras: Annotated[
        int,
        typer.Option(
            help="Most LoRA adapters loaded at once (POST /v1/load_lora_adapter past it: HTTP 400)."
        ),
    ] = 8,
    lora_modules: Annotated[
        list[str] | None,
        typer.Option(
            help="A LoRA adapter served from the start, as NAME=DIR (repeatable); requests name it as model.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve the policy with an OpenAI-compatible API (chat and text completions, streaming, tool
    calls, token capture per session); OpenAPI spec at /docs."""
    check_port_free(host, port)  # a port in use is said at once, before anything imports or loads
    from horizonrl.asgi import LOOPBACK_HOSTS, host_name

    for root in checkpoint_root or []:
        if not root.is_dir():
            raise ConfigError(f"--checkpoint-root {str(root)!r} is not a directory")
    if allow_weight_swaps_without_token and not token and host_name(host) not in LOOPBACK_HOSTS:
        raise ConfigError(
            f"--allow-weight-swaps-without-token is for a loopback --host ({', '.join(LOOPBACK_HOSTS)}), "
            f"not {host!r}: give the server a --token instead"
        )
    extra_hosts = allowed_host_options(allowed_host)
    check_range("--max-loras", max_loras, 1, 1024)
    modules = _lora_modules(lora_modules or [], max_loras)

    from horizonrl.config import load_config
    from horizonrl.serve.server import serve as run_server
    from horizonrl.serve.service import ServeLimits
    from horizonrl.train.runtime import build_runtime, checkpoint_loader

    if max_request_mib < 1:
        raise ConfigError(f"--max-request-mib must be at least 1, got {max_request_mib}")
    config = load_config(config_path, overrides)
    if checkpoint is not None and not Path(checkpoint).exists():
        raise ConfigError(f"--checkpoint {str(checkpoint)!r} does not exist")
    roots = [
        config.output_dir,
        *([Path(checkpoint)] if checkpoint is not None else []),
        *(checkpoint_root or []),
    ]
    name = model_name or config.name

    def ready() -> None:
        auth = "token required" if token else "no token (anyone on this interface may call it)"
        say(f"serving {name!r} on http://{host}:{port}/v1 · {auth} · OpenAPI at /docs")

    def load_engine() -> tuple[Any, Any]:
        runtime = build_runtime(config, checkpoint=checkpoint)
        return runtime.engine, runtime.tokenizer

    run_server(
        load_engine,
        model_name=name,
        limits=ServeLimits.for_engine(
            config.sampling.max_new_tokens, config.engine.max_batch_size, max_loras=max_loras
        ),
        load_policy=checkpoint_loader(config.model),
        host=host,
        port=port,
        token=token,
        log_level=log_level,
        max_request_mib=max_request_mib,
        checkpoint_roots=roots,
        weight_swaps_without_token=allow_weight_swaps_without_token,
        extra_hosts=extra_hosts,
        on_ready=ready,
        lora_modules=modules,
    )


def _lora_modules(values: list[str], max_loras: int) -> list[tuple[str, Path]]:
    """``--lora-modules NAME=DIR`` options, checked before anything loads."""
    modules: list[tuple[str, Path]] = []
    for value in values:
        name, sep, folder = value.partition("=")
        if not sep or not name or not folder:
            raise ConfigError(
                f"--lora-modules {value!r} is not NAME=DIR (e.g. --lora-modules sql=runs/sql/policy)"
            )
        if not Path(folder).is_dir():
            raise ConfigError(f"--lora-modules {value!r}: {folder!r} is not a directory")
        if name in (n for n, _ in modules):
            raise ConfigError(f"--lora-modules names {name!r} twice; each adapter needs a name of its own")
        modules.append((name, Path(folder)))
    if len(modules) > max_loras:
        raise ConfigError(f"--lora-modules gives {len(modules)} adapters, more than --max-loras {max_loras}")
    return modules
