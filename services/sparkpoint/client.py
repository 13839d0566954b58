"""A small client of the coordinator's REST API for the `sparkpoint` command (standard library
only). It follows 307/308 redirects for every method, so a request sent to any coordinator
instance reaches the one that owns the job.

A secured coordinator (docs/security.md) takes a bearer token (`Credentials.token`), and over
https a CA to trust (else the system's) and, for mutual TLS, a client certificate and key. The
token is sent to the address the command was given and, when that address is https, to any
https address it redirects to; never in a redirect to plain http, and from a plain-http address
never to another host or port (`Rest.may_carry_token`): such a redirect is not followed, the
error names where it led. The token is never part of an error message.
"""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urljoin, urlsplit

DEFAULT_REST = "http://127.0.0.1:8081"
MAX_REDIRECTS = 5
POLL_INTERVAL_S = 0.2

TOKEN_ENV = "SPARKPOINT_REST_TOKEN"
CA_ENV = "SPARKPOINT_REST_CA"
CERT_ENV = "SPARKPOINT_REST_CERT"
KEY_ENV = "SPARKPOINT_REST_KEY"


class RestError(RuntimeError):
    """The coordinator answered with an error (its message is Flink's ``errors`` list)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def rest_url(explicit: str | None) -> str:
    return (explicit or os.environ.get("SPARKPOINT_REST") or DEFAULT_REST).rstrip("/")


@dataclass(frozen=True)
class Credentials:
    """How the command proves who it is to a secured coordinator, and whom it trusts."""

    token: str | None = None
    ca: Path | None = None
    """PEM CA certificates that signed the coordinator's certificate (else the system's)."""
    cert: Path | None = None
    """PEM client certificate (mutual TLS), with its key in ``key`` or in the same file."""
    key: Path | None = None

    def __repr__(self) -> str:  # never the token
        return f"Credentials(token={'***' if self.token else None}, ca={self.ca}, cert={self.cert})"

    @classmethod
    def from_environment(
        cls,
        token: str | None = None,
        ca: Path | None = None,
        cert: Path | None = None,
        key: Path | None = None,
    ) -> Credentials:
        """The given values, else ``$SPARKPOINT_REST_TOKEN``, ``_CA``, ``_CERT``, ``_KEY``."""

        def path(value: Path | None, env: str) -> Path | None:
            return value or (Path(os.environ[env]) if os.environ.get(env) else None)

        return cls(
            (token or os.environ.get(TOKEN_ENV) or "").strip() or None,
            path(ca, CA_ENV),
            path(cert, CERT_ENV),
            path(key, KEY_ENV),
        )

    def ssl_context(self, flags: str = "--rest") -> ssl.SSLContext:
        """The context for https; a file that cannot be used is a `RestError` naming it by its
        flag (``flags``: the flags' prefix, ``--rest`` or ``--history``)."""
        for path, flag in ((self.ca, "ca"), (self.cert, "cert"), (self.key, "key")):
            if path is not None and not path.is_file():
                raise RestError(0, f"{flags}-{flag} {path}: no such file")
        try:
            context = ssl.create_default_context(cafile=self.ca)
        except ssl.SSLError as exc:
            raise RestError(0, f"{flags}-ca {self.ca}: not PEM CA certificates ({exc})") from None
        if self.cert is not None:
            try:
                context.load_cert_chain(self.cert, self.key)
            except ssl.SSLError as exc:
                raise RestError(
                    0,
                    f"{flags}-cert {self.cert}: not a PEM certificate with its unencrypted key "
                    f"({exc.reason or exc})",
                ) from None
        elif self.key is not None:
            raise RestError(0, f"{flags}-key needs {flags}-cert")
        return context


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class Rest:
    """The coordinator at ``base``, called with ``credentials``."""

    def __init__(self, base: str, credentials: Credentials | None = None) -> None:
        self.base = base.rstrip("/")
        self.credentials = credentials or Credentials()
        handlers: list[Any] = [_NoRedirect]
        if urlsplit(self.base).scheme == "https" or self.credentials.ca or self.credentials.cert:
            handlers.append(urllib.request.HTTPSHandler(context=self.credentials.ssl_context()))
        self._opener = urllib.request.build_opener(*handlers)

    def may_carry_token(self, url: str) -> bool:
        """Whether the token may go to ``url``: from an https base to any https address, else
        only to the base's own scheme, host and port."""
        to, base = urlsplit(url), urlsplit(self.base)
        if to.scheme == base.scheme == "https":
            return True
        return _origin(to) == _origin(base)

    def headers(self, url: str) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.credentials.token is not None:
            if not self.may_carry_token(url):
                if urlsplit(self.base).scheme == "https":
                    why = "the token would travel in clear"
                else:
                    why = (
                        f"over plain http the token goes only to {self.base} (give the owning "
                        "instance's address with --rest, or serve https)"
                    )
                raise RestError(0, f"{self.base} redirected to {url}: not followed, {why}")
            headers["Authorization"] = f"Bearer {self.credentials.token}"
        return headers

    def call(self, method: str, path: str, body: Any = None, timeout_s: float = 30.0) -> Any:
        url = f"{self.base}{path}"
        data = None if body is None else json.dumps(body).encode()
        for _ in range(MAX_REDIRECTS + 1):
            request = urllib.request.Request(
                url, data=data, method=method, headers=self.headers(url)
            )
            try:
                with self._opener.open(request, timeout=timeout_s) as response:
                    text = response.read().decode()
                    return (
                        json.loads(text)
                        if text and response.headers.get_content_type() == "application/json"
                        else text
                    )
            except urllib.error.HTTPError as exc:
                if exc.code in (307, 308) and exc.headers.get("Location"):
                    url = urljoin(url, exc.headers["Location"])
                    continue
                raise RestError(exc.code, _errors(exc)) from None
            except urllib.error.URLError as exc:
                raise RestError(
                    0, f"cannot reach the coordinator at {self.base} ({_reason(exc)})"
                ) from None
            except (ssl.SSLError, ConnectionError) as exc:  # a refused client certificate
                raise RestError(
                    0, f"cannot reach the coordinator at {self.base} ({_reason(exc)})"
                ) from None
        raise RestError(0, f"too many redirects for {path}")

    def wait_for_trigger(self, path: str, timeout_s: float) -> dict[str, Any]:
        """Polls a trigger status until it is COMPLETED; returns its ``operation``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.call("GET", path)
            if status["status"]["id"] == "COMPLETED":
                operation: dict[str, Any] = status.get("operation", {})
                if "failure-cause" in operation:
                    raise RestError(0, f"failed: {operation['failure-cause'].get('stack-trace')}")
                return operation
            time.sleep(POLL_INTERVAL_S)
        raise RestError(0, f"no result within {timeout_s:.0f} s")


def _origin(url: SplitResult) -> tuple[str, str | None, int | None]:
    """Scheme, host and port (the scheme's default when none is written)."""
    try:
        port = url.port
    except ValueError:  # not a number: matches no base
        return url.scheme, None, -1
    return url.scheme, url.hostname, port or {"http": 80, "https": 443}.get(url.scheme)


def _reason(exc: OSError) -> str:
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ssl.SSLCertVerificationError):
        return f"its certificate is not trusted: {reason.verify_message}; --rest-ca names the CA"
    if isinstance(reason, ssl.SSLError | ConnectionResetError | ConnectionAbortedError):
        return (
            f"TLS refused: {reason}; a coordinator with mutual TLS needs --rest-cert and --rest-key"
        )
    return str(reason)


def _errors(exc: urllib.error.HTTPError) -> str:
    try:
        message = "; ".join(json.loads(exc.read().decode())["errors"])
    except (ValueError, KeyError, TypeError):
        message = f"HTTP {exc.code}"
    if exc.code == 401:
        message += f" (HTTP 401: --rest-token or ${TOKEN_ENV})"
    elif exc.code == 403:
        message += " (HTTP 403)"
    return message
