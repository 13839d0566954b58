"""The REST client of the `sparkpoint` command with credentials: its token never shown, never
sent in clear after https."""

from __future__ import annotations

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


def test_credentials_come_from_the_environment_unless_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPARKPOINT_REST_TOKEN", " from-the-environment \n")
    monkeypatch.setenv("SPARKPOINT_REST_CA", "/etc/ca.pem")
    found = Credentials.from_environment()
    assert found.token == "from-the-environment" and str(found.ca) == "/etc/ca.pem"
    assert Credentials.from_environment(token="given").token == "given"
