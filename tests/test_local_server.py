"""A server started as a process: ready once /health answers, stopped on exit, and one clear error
when it dies first."""

from __future__ import annotations

import socket
import sys

import httpx
import pytest

from horizonrl.local_server import free_port, healthy_process

HEALTH_SERVER = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_yields_once_health_answers_and_stops_the_process_on_exit() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with healthy_process([sys.executable, "-c", HEALTH_SERVER, str(port)], url, start_timeout_s=30) as proc:
        assert httpx.get(f"{url}/health").status_code == 200
        assert proc.poll() is None
    assert proc.poll() is not None  # terminated on exit


def test_a_process_that_exits_first_is_one_error_naming_the_command() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    command = [sys.executable, "-c", "raise SystemExit(3)"]
    expected = r"raise SystemExit\(3\)` did not answer on .*/health .*exit code 3"
    with (
        pytest.raises(ValueError, match=expected),
        healthy_process(command, url, start_timeout_s=30, error=ValueError),
    ):
        pass
