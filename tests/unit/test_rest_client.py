"""The REST client of the `sparkpoint` command with credentials: its token never shown, never
sent in clear after https, and over plain http never to another address than the one given."""

from __future__ import annotations

import http.server
import threading
from typing import Any

import pytest

from sparkpoint.client import Credentials, Rest, RestError

pytestmark = pytest.mark.unit

TOKEN = "alice-operates-0123456789"


def test_the_client_never_shows_its_token() -> None:
    credentials = Credentials(token=TOKEN)
    assert TOKEN not in repr(credentials) and TOKEN not in str(credentials)


def test_the_client_refuses_to_follow_https_to_plain_http_with_a_token() -> None:
    rest = Rest.__new__(Rest)  # no TLS context: nothing here opens a connection
    rest.base, rest.credentials = "https://coordinator-a:8081", Credentials(token=TOKEN)
    assert rest.headers("https://coordinator-b:8081/jobs")["Authorization"] == f"Bearer {TOKEN}"
    with pytest.raises(RestError) as raised:
        rest.headers("http://coordinator-b:8081/jobs")
    assert "in clear" in str(raised.value) and TOKEN not in str(raised.value)


def rest(base: str) -> Rest:
    """A client of ``base`` with the token; no TLS context: nothing here opens a connection."""
    client = Rest.__new__(Rest)
    client.base, client.credentials = base, Credentials(token=TOKEN)
    return client


def test_over_plain_http_the_token_goes_only_to_the_address_the_command_was_given() -> None:
    client = rest("http://coordinator-a:8081")
    for same in ("http://coordinator-a:8081/jobs", "http://COORDINATOR-A:8081/v1/jobs"):
        assert client.headers(same)["Authorization"] == f"Bearer {TOKEN}"
    for elsewhere in (
        "http://coordinator-b:8081/jobs",  # another host
        "http://coordinator-a:8082/jobs",  # another port
        "https://coordinator-b:8081/jobs",  # https, but the redirect itself came in clear
    ):
        with pytest.raises(RestError) as raised:
            client.headers(elsewhere)
        assert f"redirected to {elsewhere}: not followed" in str(raised.value)
        assert TOKEN not in str(raised.value)
    assert rest("http://coordinator-a").headers("http://coordinator-a:80/jobs")


def test_a_redirect_elsewhere_from_plain_http_is_not_followed_with_the_token() -> None:
    class Redirecting(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(307)
            self.send_header("Location", f"http://localhost:{port}/jobs")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    seen: list[str | None] = []
    server = http.server.HTTPServer(("127.0.0.1", 0), Redirecting)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RestError) as raised:
            Rest(f"http://127.0.0.1:{port}", Credentials(token=TOKEN)).call("GET", "/jobs")
    finally:
        server.shutdown()
    # the same server under another name is another address: asked once, with the token
    assert seen == [f"Bearer {TOKEN}"]
    assert f"redirected to http://localhost:{port}/jobs: not followed" in str(raised.value)


def test_credentials_come_from_the_environment_unless_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPARKPOINT_REST_TOKEN", " from-the-environment \n")
    monkeypatch.setenv("SPARKPOINT_REST_CA", "/etc/ca.pem")
    found = Credentials.from_environment()
    assert found.token == "from-the-environment" and str(found.ca) == "/etc/ca.pem"
    assert Credentials.from_environment(token="given").token == "given"
