"""The oras client, adapted: bounded retries and timeouts, Basic or token auth, one error type.

Imported only by ``kernelcache.remote.oci`` once a registry is really needed, so that nothing else
in kernelcache imports oras. What changes from ``oras.provider.Registry``:

* ``do_request`` retries a refused connection, a timeout, a 429 or a 5xx a few times with a short
  backoff (``KERNELCACHE_REMOTE_RETRIES``, default 2) instead of oras's five tries over minutes,
  and every request has a timeout (``KERNELCACHE_REMOTE_TIMEOUT`` seconds of silence, default 60);
* a registry that answers ``WWW-Authenticate: Basic`` (distribution with htpasswd, Artifactory,
  Nexus) gets the credentials directly; token registries (ghcr.io, ECR, GAR, Harbor, quay) keep
  oras's token flow;
* credentials come from ``KERNELCACHE_REGISTRY_USER`` / ``KERNELCACHE_REGISTRY_PASSWORD``, else the
  docker config (``$DOCKER_CONFIG/config.json`` or ``~/.docker/config.json``, credential helpers too);
* transport failures and refusals raise ``RemoteError`` with one readable line.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import oras.auth
import oras.container
import oras.provider
import requests
from requests.adapters import HTTPAdapter

from ..errors import RemoteError

logging.getLogger("oras").setLevel(logging.CRITICAL)  # kernelcache reports errors itself, once

_UNRETRIED = getattr(oras.provider.Registry.do_request, "__wrapped__", oras.provider.Registry.do_request)
RETRY_STATUS = {429, 500, 502, 503, 504}


def _env_number(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


class _TimeoutAdapter(HTTPAdapter):
    """requests has no session-wide timeout; oras passes none. Give every request one."""

    def __init__(self, timeout: float):
        super().__init__()
        self.timeout = timeout

    def send(self, request, **kwargs):
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = (min(10.0, self.timeout), self.timeout)
        return super().send(request, **kwargs)


class _Auth(oras.auth.TokenAuth):
    """oras's token auth, plus a direct answer to a Basic challenge."""

    basic_only = False

    def authenticate_request(self, original: requests.Response, headers: dict, refresh: bool = False):
        challenge = original.headers.get("Www-Authenticate", "")
        if not challenge.lower().startswith("basic"):
            return super().authenticate_request(original, headers, refresh)
        credentials = getattr(self, "_basic_auth", None)
        if not credentials or refresh:
            return headers or {}, False
        self.basic_only = True
        return {**(headers or {}), "Authorization": f"Basic {credentials}"}, True


class Client(oras.provider.Registry):
    def __init__(self, host: str, plain_http: bool):
        super().__init__(hostname=host, insecure=plain_http)
        self.retries = int(_env_number("KERNELCACHE_REMOTE_RETRIES", 2))
        adapter = _TimeoutAdapter(_env_number("KERNELCACHE_REMOTE_TIMEOUT", 60))
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.auth = _Auth()
        self.auth.session, self.auth.prefix, self.auth._tls_verify = self.session, self.prefix, self._tls_verify

    def do_request(self, url: str, method: str = "GET", data=None, headers: dict | None = None, json=None,
                   stream: bool = False) -> requests.Response:
        headers = dict(headers or {})
        if self.auth.basic_only and getattr(self.auth, "_basic_auth", None):
            headers["Authorization"] = f"Basic {self.auth._basic_auth}"
        failure = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(0.5 * 2 ** attempt, 8))
            try:
                response = _UNRETRIED(self, url, method, data, dict(headers), json, stream)
            except requests.RequestException as exc:
                failure = _reason(exc)
                continue
            except ValueError as exc:  # oras: "Cannot respond to request for authentication."
                raise RemoteError(f"{self.hostname} refused the credentials or needs some: {exc} "
                                  "(set KERNELCACHE_REGISTRY_USER/_PASSWORD or log in with docker/oras)") from None
            if response.status_code in RETRY_STATUS and attempt < self.retries:
                failure = f"HTTP {response.status_code}"
                continue
            if response.status_code in (401, 403):
                raise RemoteError(f"{self.hostname} denied {method} {_path(url)} (HTTP {response.status_code}): "
                                  "check the credentials (KERNELCACHE_REGISTRY_USER/_PASSWORD or docker config)")
            return response
        raise RemoteError(f"cannot reach registry {self.hostname}: {failure} (after {self.retries + 1} attempts)")


def connect(host: str, plain_http: bool, repository: str) -> Client:
    client = Client(host, plain_http)
    user, password = os.environ.get("KERNELCACHE_REGISTRY_USER"), os.environ.get("KERNELCACHE_REGISTRY_PASSWORD")
    if user and password:
        client.auth.set_basic_auth(user, password)
    else:
        config = Path(os.environ["DOCKER_CONFIG"]) / "config.json" if os.environ.get("DOCKER_CONFIG") else None
        client.auth.load_configs(container(host, repository), configs=[str(config)] if config else None)
    return client


def container(host: str, repository: str, reference: str | None = None) -> oras.container.Container:
    """An oras Container for exactly these parts (its parser guesses hosts; we already know it)."""
    box = oras.container.Container("placeholder", registry=host)
    namespace, _, name = repository.rpartition("/")
    box.registry, box.namespace, box.repository = host, namespace or None, name
    box.tag, box.digest = (None, reference) if reference and reference.startswith("sha256:") else (reference, None)
    return box


def error_text(response: requests.Response) -> str:
    """The registry's own error message (OCI error JSON), else the HTTP reason."""
    try:
        errors = response.json().get("errors") or []
        text = "; ".join(f"{e.get('code', '')}: {e.get('message', '')}".strip(": ") for e in errors)
    except (ValueError, AttributeError):
        text = ""
    return f"HTTP {response.status_code} {text or response.reason}"


def _reason(exc: requests.RequestException) -> str:
    if isinstance(exc, requests.ConnectionError):
        return "connection failed (refused, reset or no route)"
    if isinstance(exc, requests.Timeout):
        return "timed out"
    return f"{type(exc).__name__}: {exc}"


def _path(url: str) -> str:
    return "/" + url.split("://", 1)[-1].split("/", 1)[-1]
