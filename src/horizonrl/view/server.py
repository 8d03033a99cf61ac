"""Serving an ASGI app (the viewer, or the viewer beside a stream's feedback API) with uvicorn on a
background thread: ``with ViewerServer(app, port=0) as server: ... server.url``."""

from __future__ import annotations

import threading
import time
from typing import Any

from horizonrl.asgi import HostGate, allowed_hosts, listening_socket
from horizonrl.errors import HorizonError

START_TIMEOUT_S = 30.0


class ViewerServer:
    """``app`` served by uvicorn on a daemon thread. :meth:`start` returns once it accepts
    connections, with :attr:`url` set; :meth:`stop` shuts it down. It answers requests whose
    ``Host`` is a loopback name, ``host`` or one of ``extra_hosts`` (others: 400, against DNS
    rebinding; :class:`horizonrl.asgi.HostGate`)."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        extra_hosts: tuple[str, ...] = (),
    ) -> None:
        self.app, self.host, self.port, self.log_level = app, host, port, log_level
        self.extra_hosts = extra_hosts
        self.url: str | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._failed: list[BaseException] = []

    def start(self) -> ViewerServer:
        import uvicorn

        sock = listening_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        gated = HostGate(self.app, allowed_hosts=allowed_hosts(self.host, self.extra_hosts))
        config = uvicorn.Config(gated, log_level=self.log_level, lifespan="off", timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)

        def run() -> None:
            try:
                self._server.run(sockets=[sock])
            except BaseException as exc:  # reported by start()
                self._failed.append(exc)
            finally:
                sock.close()

        self._thread = threading.Thread(target=run, name="horizon-view", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                why = self._failed[0] if self._failed else "it did not start in time"
                raise HorizonError(f"the viewer could not serve on {self.host}:{self.port}: {why}")
            time.sleep(0.01)
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{shown}:{self.port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> ViewerServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
