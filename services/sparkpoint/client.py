"""A small client of the coordinator's REST API for the `sparkpoint` command (standard library
only). It follows 307/308 redirects for every method, so a request sent to any coordinator
instance reaches the one that owns the job."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

DEFAULT_REST = "http://127.0.0.1:8081"
MAX_REDIRECTS = 5
POLL_INTERVAL_S = 0.2


class RestError(RuntimeError):
    """The coordinator answered with an error (its message is Flink's ``errors`` list)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def rest_url(explicit: str | None) -> str:
    return (explicit or os.environ.get("SPARKPOINT_REST") or DEFAULT_REST).rstrip("/")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def call(base: str, method: str, path: str, body: Any = None, timeout_s: float = 30.0) -> Any:
    url = f"{base}{path}"
    data = None if body is None else json.dumps(body).encode()
    for _ in range(MAX_REDIRECTS + 1):
        request = urllib.request.Request(
            url, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with _opener.open(request, timeout=timeout_s) as response:
                text = response.read().decode()
                return (
                    json.loads(text)
                    if text and response.headers.get_content_type() == "application/json"
                    else text
                )
        except urllib.error.HTTPError as exc:
            if exc.code in (307, 308) and exc.headers.get("Location"):
                url = exc.headers["Location"]
                continue
            raise RestError(exc.code, _errors(exc)) from None
        except urllib.error.URLError as exc:
            raise RestError(0, f"cannot reach the coordinator at {base} ({exc.reason})") from None
    raise RestError(0, f"too many redirects for {path}")


def _errors(exc: urllib.error.HTTPError) -> str:
    try:
        return "; ".join(json.loads(exc.read().decode())["errors"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {exc.code}"


def wait_for_trigger(base: str, path: str, timeout_s: float) -> dict[str, Any]:
    """Polls a trigger status until it is COMPLETED; returns its ``operation``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = call(base, "GET", path)
        if status["status"]["id"] == "COMPLETED":
            operation: dict[str, Any] = status.get("operation", {})
            if "failure-cause" in operation:
                raise RestError(0, f"failed: {operation['failure-cause'].get('stack-trace')}")
            return operation
        time.sleep(POLL_INTERVAL_S)
    raise RestError(0, f"no result within {timeout_s:.0f} s")
