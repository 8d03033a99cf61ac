"""Running the policy server: a loaded policy to a live app (:func:`serve`, the ``horizon serve``
command), in the current event loop (:class:`LiveServer`, for runners and tests), or as a separate
``horizon serve`` process (:func:`serve_in_subprocess`).

The server reads no recipe: it is handed what it serves — a callable that loads the policy's engine
and tokenizer, the limits, the model's name, and how to load another policy for
``/v1/horizon/weights`` and from where (:class:`~horizonrl.serve.weights.WeightSwaps`) — by whoever
starts it (``horizon serve`` builds them with
:func:`horizonrl.train.runtime.build_runtime`, :meth:`ServeLimits.for_engine` and
:func:`horizonrl.train.runtime.checkpoint_loader`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from horizonrl.asgi import LOOPBACK_HOSTS, allowed_hosts
from horizonrl.errors import ConfigError, HorizonError
from horizonrl.local_server import free_port, healthy_process
from horizonrl.serve.service import ServeLimits

UVICORN_OPTIONS: dict[str, Any] = {"loop": "asyncio", "timeout_keep_alive": 75}
"""How uvicorn runs the app: asyncio's own loop (the engine decodes on it), and a keep-alive longer
than any client's (a server closing an idle connection just as a client reuses it drops a request)."""


FAST_HTTP: dict[str, Any] = {"loop": "uvloop", "http": "httptools"}
"""``horizon serve``'s HTTP thread runs nothing but the app (no subprocesses), so it takes uvloop and
httptools, uvicorn's fast loop and parser."""


def policy_loader(load: Callable[[str], Any], engine: Any) -> Callable[[str], Callable[[], None]]:
    """``load_policy(checkpoint)`` for ``/v1/horizon/weights``: reads the policy with ``load`` (e.g.
    :func:`horizonrl.train.runtime.checkpoint_loader`) and returns the update that copies it into
    ``engine``."""

    def load_policy(checkpoint: str) -> Callable[[], None]:
        policy = load(checkpoint)
        return lambda: engine.update_weights(policy)

    return load_policy


def build_app(
    engine: Any,
    tokenizer: Any,
    *,
    model_name: str,
    limits: ServeLimits,
    token: str | None,
    max_request_bytes: int,
    load_policy: Callable[[str], Any] | None = None,
    checkpoint_roots: Sequence[Path] = (),
    weight_swaps_without_token: bool = False,
    hosts: Sequence[str] = LOOPBACK_HOSTS,
    engine_loop: asyncio.AbstractEventLoop | None = None,
    lora_modules: Sequence[tuple[str, Path]] = (),
) -> Any:
    """The app serving ``engine`` as ``model_name`` to requests for ``hosts``; ``load_policy(checkpoint)``
    reads another policy for ``/v1/horizon/weights``, from under ``checkpoint_roots`` only (none: that
    route and LoRA adapter loads answer 404). With ``engine_loop`` the engine runs on that loop's
    thread and the app reaches it through an :class:`EngineBridge`. ``lora_modules`` are LoRA
    adapters ``(name, directory)`` served from the start (ConfigError when one cannot be)."""
    from horizonrl.serve.app import create_app
    from horizonrl.serve.bridge import EngineBridge
    from horizonrl.serve.service import PolicyService
    from horizonrl.serve.weights import WeightSwaps

    engine = EngineBridge(engine, engine_loop) if engine_loop is not None else engine
    service = PolicyService(engine, tokenizer, model_name, limits)
    for name, folder in lora_modules:
        if not service.loras.supported:
            raise ConfigError(
                "--lora-modules: this engine cannot serve LoRA adapters (engine.kind hf serves them)"
            )
        try:
            service.loras.preload(name, folder)
        except ValueError as exc:
            raise ConfigError(
                f"--lora-modules {name}={folder}: {str(exc).removeprefix(f'add_adapter: {folder}: ')}"
            ) from None
    swaps = (
        WeightSwaps(policy_loader(load_policy, engine), checkpoint_roots, weight_swaps_without_token)
        if load_policy is not None
        else None
    )
    return create_app(
        service, token=token, max_request_bytes=max_request_bytes, weight_swaps=swaps, allowed_hosts=hosts
    )


def serve(
    load_engine: Callable[[], tuple[Any, Any]],
    *,
    model_name: str,
    limits: ServeLimits,
    load_policy: Callable[[str], Any] | None,
    host: str,
    port: int,
    token: str | None,
    log_level: str = "info",
    max_request_mib: int = 16,
    checkpoint_roots: Sequence[Path] = (),
    weight_swaps_without_token: bool = False,
    extra_hosts: Sequence[str] = (),
    on_ready: Callable[[], None] | None = None,
    lora_modules: Sequence[tuple[str, Path]] = (),
) -> None:
    """Serve a policy until interrupted: ``load_engine()`` loads it (its engine and tokenizer) once
    this (main) thread's event loop is set up, the engine decodes on that loop and the HTTP server
    runs on a second thread (see :mod:`horizonrl.serve.bridge`). It answers requests for the
    loopback names, ``host`` and ``extra_hosts`` (:func:`horizonrl.asgi.allowed_hosts`), with the
    LoRA adapters ``lora_modules`` (``(name, directory)``) served from the start."""
    import threading

    import uvicorn

    if not 1 <= port <= 65535:
        raise ConfigError(f"--port {port} is out of range; valid ports: 1-65535")
    if max_request_mib < 1:
        raise ConfigError(f"--max-request-mib must be at least 1, got {max_request_mib}")
    engine_loop = asyncio.new_event_loop()
    asyncio.set_event_loop(engine_loop)
    engine, tokenizer = load_engine()
    app = build_app(
        engine,
        tokenizer,
        model_name=model_name,
        limits=limits,
        token=token,
        max_request_bytes=max_request_mib * 2**20,
        load_policy=load_policy,
        checkpoint_roots=checkpoint_roots,
        weight_swaps_without_token=weight_swaps_without_token,
        hosts=allowed_hosts(host, extra_hosts),
        engine_loop=engine_loop,
        lora_modules=lora_modules,
    )
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level=log_level, **{**UVICORN_OPTIONS, **FAST_HTTP})
    )
    server.install_signal_handlers = lambda: None  # Ctrl-C reaches the main thread, which stops it
    failed: list[BaseException] = []

    def run_http() -> None:
        try:
            server.run()
        except BaseException as exc:  # e.g. the port is taken
            failed.append(exc)
        finally:
            engine_loop.call_soon_threadsafe(engine_loop.stop)

    thread = threading.Thread(target=run_http, name="horizon-serve-http", daemon=True)
    thread.start()
    if on_ready is not None:
        on_ready()
    try:
        engine_loop.run_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    if failed or not server.started:
        raise ConfigError(
            f"horizon serve could not serve on {host}:{port}: {failed[0] if failed else 'stopped'}"
        )


class LiveServer:
    """``app`` served by uvicorn inside the running event loop (the engine then decodes on it):
    ``async with LiveServer(app) as url: ...``."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app, self.host, self.port = app, host, port or free_port()
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def __aenter__(self) -> str:
        import uvicorn

        config = uvicorn.Config(
            self.app, host=self.host, port=self.port, log_level="warning", lifespan="off", **UVICORN_OPTIONS
        )
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # the host process keeps its Ctrl-C
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it (e.g. the port is taken)
                raise HorizonError(f"the policy server on {self.url} stopped while starting")
            await asyncio.sleep(0.01)
        return self.url

    async def __aexit__(self, *exc: Any) -> None:
        assert self._server is not None and self._task is not None
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@contextlib.contextmanager
def serve_in_subprocess(
    config_path: str,
    overrides: list[str],
    *,
    token: str | None = None,
    start_timeout_s: float = 120.0,
    extra_args: list[str] | None = None,
    checkpoint_roots: Sequence[str] | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real ``horizon serve`` process on a free loopback port, ready when this yields its URL;
    terminated on exit. Its weight swaps load checkpoints under ``checkpoint_roots`` (default: the
    temporary directory, where ``engine.kind: openai`` writes the policies it syncs unless
    ``engine.sync_dir`` says otherwise)."""
    port = free_port()
    roots = [tempfile.gettempdir()] if checkpoint_roots is None else list(checkpoint_roots)
    horizon = Path(sys.executable).with_name("horizon")
    command = [
        str(horizon),
        "serve",
        config_path,
        *overrides,
        "--port",
        str(port),
        "--log-level",
        "warning",
        *(arg for root in roots for arg in ("--checkpoint-root", root)),
        *(extra_args or []),
    ]
    env = {**os.environ}
    if token is not None:
        env["HORIZON_SERVE_TOKEN"] = token
    url = f"http://127.0.0.1:{port}"
    with healthy_process(
        command, url, env=env, start_timeout_s=start_timeout_s, error=HorizonError, poll_s=0.2
    ) as proc:
        yield url, proc
