"""Real servers on loopback for the transport tests: a CNCF distribution registry and an HTTP server.

The registry is Debian's ``docker-registry`` (distribution 2.8), which scripts/setup.sh installs;
each test session runs its own on a free port with its storage in a temp dir, optionally behind
htpasswd (bcrypt) auth. The HTTP server serves a directory, and misbehaves on purpose under
``/truncated/`` (promises the whole file, sends half, hangs up) and ``/missing/``.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

REGISTRY_BINARY = "docker-registry"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Registry:
    host: str  # "127.0.0.1:PORT"
    root: Path  # storage root
    process: subprocess.Popen

    def blob_path(self, digest: str) -> Path:
        hexdigest = digest.removeprefix("sha256:")
        return self.root / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"

    def get(self, path: str, accept: str = "") -> bytes:
        request = urllib.request.Request(f"http://{self.host}{path}", headers={"Accept": accept} if accept else {})
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.read()


def require_registry_binary() -> str:
    found = shutil.which(REGISTRY_BINARY)
    if found is None:
        message = f"{REGISTRY_BINARY} is not installed (scripts/setup.sh installs Debian's docker-registry)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


@contextlib.contextmanager
def registry(workdir: Path, htpasswd: str | None = None, access_log: bool = False):
    binary = require_registry_binary()
    port = free_port()
    root = workdir / "storage"
    auth = ""
    if htpasswd is not None:
        (workdir / "htpasswd").write_text(htpasswd)
        auth = f"auth:\n  htpasswd:\n    realm: kernelcache-test\n    path: {workdir / 'htpasswd'}\n"
    config = workdir / "config.yml"
    config.write_text(
        f"version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: {str(not access_log).lower()}\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n{auth}"
    )
    log = open(workdir / "registry.log", "wb")  # noqa: SIM115 - lives as long as the server
    process = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(f"http://127.0.0.1:{port}/v2/", process, workdir / "registry.log")
        yield Registry(f"127.0.0.1:{port}", root, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def _wait_ready(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"registry exited: {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError as exc:  # 401: up, and asking for credentials
            if exc.code == 401:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"registry did not come up: {log.read_text()[-2000:]}")


def htpasswd_line(user: str, password: str) -> str:
    import bcrypt

    return f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()}\n"


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/truncated/"):
            data = (Path(self.directory) / self.path.removeprefix("/truncated/")).read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/zstd")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.close_connection = True
            with contextlib.suppress(OSError):  # the client may hang up first
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        super().do_GET()


@contextlib.contextmanager
def http_server(directory: Path):
    handler = lambda *a, **kw: _Handler(*a, directory=str(directory), **kw)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
