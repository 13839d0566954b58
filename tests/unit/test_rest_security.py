"""The REST endpoint's security as pure logic: the access list and its errors, who a request is
and what its role allows, the audited principal, the settings from YAML keys, and the guard
driven as an ASGI app in memory (no socket, no file)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.common.redaction import REDACTED, register_secrets
from sparkpoint.common.rest_security import RestGuard, RestSecurity, Role, token_digest
from sparkpoint.common.rest_security.access import (
    AccessList,
    AccessListError,
    Identity,
    Refusal,
    authenticate,
    authorize,
    certificate_name,
    parse_access_list,
)
from sparkpoint.common.rest_security.access_file import AccessFile, read_access_list
from sparkpoint.common.rest_security.guard import PRINCIPAL
from sparkpoint.common.rest_security.settings import (
    SecuritySettingsError,
    proxy_network,
    trusted,
)
from sparkpoint.coordinator.main import UVICORN_LOGGERS, advertised_url, uvicorn_config
from sparkpoint.coordinator.rest.flink_compat import FORWARD, forward

pytestmark = pytest.mark.unit

ALICE = "alice-operates-0123456789"
GRAFANA = "grafana-reads-0123456789"


def access_list(**extra: Any) -> AccessList:
    return parse_access_list(
        {
            "tokens": [
                {"principal": "alice", "role": "operate", "sha256": token_digest(ALICE)},
                {"principal": "grafana", "role": "read", "token": GRAFANA},
            ],
            **extra,
        },
        "access.yaml",
    )


# the access list


def test_a_token_is_known_by_its_digest_or_in_clear() -> None:
    access = access_list()
    assert access.by_token(ALICE) == Identity("alice", Role.OPERATE, "token")
    assert access.by_token(GRAFANA) == Identity("grafana", Role.READ, "token")
    assert access.by_token("nobody-has-this-token") is None
    assert access.clear_tokens == (GRAFANA,)


def test_the_digest_is_sha256_hex_as_sha256sum_prints_it() -> None:
    assert token_digest("test") == (
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    )


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ([], "expected a mapping"),
        ({"token": []}, "unknown key 'token'"),
        ({"tokens": {}}, "tokens must be a list"),
        ({"tokens": ["x"]}, "tokens entry 1: expected a mapping"),
        ({"tokens": [{"principal": "a", "role": "admin", "sha256": "0" * 64}]}, "'admin' is neither read nor operate"),
        ({"tokens": [{"principal": "", "role": "read", "sha256": "0" * 64}]}, "principal must be a non-empty string"),
        ({"tokens": [{"principal": "a", "role": "read"}]}, "(a): give exactly one of sha256 and token"),
        ({"tokens": [{"principal": "a", "role": "read", "sha256": "abc"}]}, "sha256 must be 64 hex digits"),
        ({"tokens": [{"principal": "a", "role": "read", "token": "short"}]}, "at least 16 characters"),
        ({"tokens": [{"principal": "a", "role": "read", "sha256": "0" * 64, "roles": 1}]}, "unknown key 'roles'"),
        ({"tokens": [{"principal": "a", "role": "read", "sha256": "0" * 64},
                     {"principal": "b", "role": "operate", "sha256": "0" * 64}]},
         "tokens entry 2 (b): the same token as a"),
        ({"certificates": ["ci"]}, "certificates must map"),
        ({"certificates": {"ci": "root"}}, "certificates.ci: role 'root'"),
        ({"tokens": [], "certificate-default-role": "all"}, "certificate-default-role: role 'all'"),
    ],
)  # fmt: skip
def test_a_malformed_access_list_names_its_file_and_what_is_wrong(data: Any, expected: str) -> None:
    with pytest.raises(AccessListError) as raised:
        parse_access_list(data, "/etc/sparkpoint/access.yaml")
    assert str(raised.value).startswith("/etc/sparkpoint/access.yaml: ")
    assert expected in str(raised.value)


@pytest.mark.parametrize(
    "text",
    ["", "# every token revoked\n", "certificate-default-role: none\n", "{}"],
    ids=["empty", "comments-only", "cut-before-the-lists", "empty-json"],
)
def test_a_file_listing_neither_tokens_nor_certificates_is_broken_not_empty(
    text: str, tmp_path: Path
) -> None:
    # such a list would let every certificate of the client CA operate (the default role)
    path = tmp_path / "access.yaml"
    path.write_text(text)
    with pytest.raises(AccessListError) as raised:
        read_access_list(path)
    assert str(raised.value).startswith(f"{path}: neither tokens nor certificates")


def test_a_list_with_no_token_says_so_and_admits_certificates_by_the_default_role() -> None:
    access = parse_access_list({"tokens": []}, "access.yaml")
    assert access.tokens == {} and access.certificate_role is Role.OPERATE
    assert parse_access_list({"certificates": None}, "access.yaml").certificates == {}


def test_an_emptied_access_file_refuses_every_request_until_it_lists_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "access.yaml"
    path.write_text("certificates: {oncall: read}\ncertificate-default-role: none\n")
    current = AccessFile(path).current
    assert authenticate(None, "stranger", current()) == Refusal(
        403, "the client certificate 'stranger' is not admitted"
    )
    path.write_text("")  # `: > access.yaml`, or an editor between truncating and writing
    refused = authenticate(None, "stranger", current())
    assert isinstance(refused, Refusal) and refused.status == 503
    path.write_text("certificates: {oncall: read}\ncertificate-default-role: none\n# fixed\n")
    assert authenticate(None, "oncall", current()) == Identity("oncall", Role.READ, "certificate")


def test_certificates_get_their_listed_role_else_the_default_role() -> None:
    access = access_list(certificates={"oncall": "read"}, **{"certificate-default-role": "none"})
    assert access.by_certificate("oncall") == Identity("oncall", Role.READ, "certificate")
    assert access.by_certificate("stranger") is None
    relaxed = access_list(**{"certificate-default-role": "read"})
    assert relaxed.by_certificate("stranger") == Identity("stranger", Role.READ, "certificate")


# who sends a request, and what the role allows


def test_no_credential_is_401_with_a_bearer_challenge() -> None:
    refused = authenticate(None, None, access_list())
    assert isinstance(refused, Refusal) and refused.status == 401
    assert refused.challenge == 'Bearer realm="sparkpoint"'
    assert "Authorization: Bearer" in refused.message


def test_an_unknown_token_is_401_invalid_token_even_with_a_trusted_certificate() -> None:
    refused = authenticate("Bearer wrong-token-0123456789", "ci-pipeline", access_list())
    assert isinstance(refused, Refusal) and refused.status == 401
    assert refused.challenge is not None and 'error="invalid_token"' in refused.challenge
    assert "wrong-token" not in refused.message


def test_only_the_bearer_scheme_is_accepted() -> None:
    refused = authenticate("Basic YWxpY2U6c2VjcmV0", None, access_list())
    assert isinstance(refused, Refusal) and refused.status == 401
    assert "only bearer tokens" in refused.message


def test_a_token_wins_over_the_certificate() -> None:
    assert authenticate(f"Bearer {GRAFANA}", "ci-pipeline", access_list()) == Identity(
        "grafana", Role.READ, "token"
    )
    assert authenticate(f"bearer  {ALICE} ", None, access_list()) == Identity(
        "alice", Role.OPERATE, "token"
    )


def test_a_certificate_alone_names_the_principal() -> None:
    assert authenticate(None, "ci-pipeline", access_list()) == Identity(
        "ci-pipeline", Role.OPERATE, "certificate"
    )


def test_an_unreadable_access_list_refuses_everyone() -> None:
    refused = authenticate(f"Bearer {ALICE}", None, None)
    assert isinstance(refused, Refusal) and refused.status == 503


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS"])
def test_read_may_read(method: str) -> None:
    assert authorize(Identity("grafana", Role.READ, "token"), method, "/jobs") is None


@pytest.mark.parametrize("method", ["POST", "PATCH", "DELETE", "PUT"])
def test_read_may_not_operate_and_the_403_names_what_was_missing(method: str) -> None:
    refused = authorize(Identity("grafana", Role.READ, "token"), method, "/jobs/j/stop")
    assert refused is not None and refused.status == 403
    assert refused.message == (
        f"grafana has the read role; {method} /jobs/j/stop needs the operate role"
    )
    assert authorize(Identity("alice", Role.OPERATE, "token"), method, "/jobs/j/stop") is None


def test_a_certificate_is_named_by_its_cn_else_its_first_alternative_name() -> None:
    subject = ((("countryName", "DE"),), (("commonName", "ci-pipeline"),))
    assert certificate_name({"subject": subject}) == "ci-pipeline"
    assert certificate_name({"subject": (), "subjectAltName": (("DNS", "ci.example"),)}) == (
        "ci.example"
    )
    assert certificate_name({"subject": ((("organizationName", "x"),),)}) is None


# settings


def test_settings_from_yaml_keys_and_flags_over_them() -> None:
    from_file = RestSecurity.from_options(
        {
            "security.ssl.rest.certificate": "/tls/rest.pem",
            "security.ssl.rest.private-key": "/tls/rest.key",
            "security.rest.access-file": "/etc/access.yaml",
            "security.rest.trusted-proxies": "10.0.0.0/24, 10.1.0.7",
            "execution.checkpointing.interval": "1s",
        }
    )
    assert str(from_file.certificate) == "/tls/rest.pem" and from_file.scheme == "https"
    assert from_file.authenticates and from_file.client_ca is None
    assert [str(p) for p in from_file.trusted_proxies] == ["10.0.0.0/24", "10.1.0.7/32"]
    flags = RestSecurity(access_file=from_file.certificate)
    assert flags.over(from_file).access_file == from_file.certificate
    assert flags.over(from_file).private_key == from_file.private_key


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("security.ssl.rest.keystore", "sparkpoint takes PEM files"),
        ("security.ssl.rest.truststore-password", "sparkpoint takes PEM files"),
        ("security.rest.tokens", "known: security.ssl.rest.certificate"),
    ],
)
def test_an_unknown_key_of_the_family_is_refused_naming_what_to_use(
    key: str, expected: str
) -> None:
    with pytest.raises(SecuritySettingsError) as raised:
        RestSecurity.from_options({key: "x"}, "coordinator.yaml")
    assert str(raised.value).startswith(f"coordinator.yaml: unknown key {key}")
    assert expected in str(raised.value)


def test_a_certificate_without_its_key_or_a_client_ca_without_tls_is_refused() -> None:
    with pytest.raises(SecuritySettingsError, match="go together"):
        RestSecurity(certificate=from_path("/tls/rest.pem")).check()
    with pytest.raises(SecuritySettingsError, match="needs --rest-tls-cert"):
        RestSecurity(client_ca=from_path("/tls/ca.pem")).check()


def from_path(text: str) -> Any:
    from pathlib import Path

    return Path(text)


def test_nothing_configured_changes_nothing_in_uvicorn() -> None:
    assert RestSecurity().uvicorn_options() == {}
    assert not RestSecurity().configured and RestSecurity().scheme == "http"
    # anything configured: no X-Forwarded-For rewriting of the address proxies are judged by
    proxies = RestSecurity(trusted_proxies=(proxy_network("10.0.0.1"),))
    assert proxies.uvicorn_options() == {"proxy_headers": False}


def test_trusted_proxies_are_addresses_or_networks() -> None:
    proxies = [proxy_network("10.0.0.0/24"), proxy_network("::1")]
    assert trusted("10.0.0.9", proxies) and trusted("::1", proxies)
    assert not trusted("10.0.1.9", proxies) and not trusted(None, proxies)
    assert not trusted("not-an-ip", proxies)
    with pytest.raises(SecuritySettingsError, match="not an IP address"):
        proxy_network("proxy.example")


def test_the_advertised_url_follows_the_scheme() -> None:
    assert advertised_url("10.0.0.5", 8081, None, "https") == "https://10.0.0.5:8081"
    assert advertised_url("10.0.0.5", 8081, None) == "http://10.0.0.5:8081"


# what uvicorn logs


@pytest.fixture
def uvicorn_logging() -> Iterator[None]:
    """uvicorn's loggers as they were before the test configured them."""
    kept = {name: (logging.getLogger(name).handlers[:], logging.getLogger(name).propagate)
            for name in UVICORN_LOGGERS}  # fmt: skip
    yield
    for name, (handlers, propagate) in kept.items():
        logging.getLogger(name).handlers[:] = handlers
        logging.getLogger(name).propagate = propagate


@pytest.mark.usefixtures("uvicorn_logging")
def test_what_uvicorn_logs_through_its_own_handlers_is_redacted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    secret = "uvicorn-sees-this-secret-0123"
    register_secrets([secret])
    uvicorn_config(Recorded(), "127.0.0.1", 0, RestSecurity())  # uvicorn's dictConfig, real
    try:
        raise RuntimeError(f"cannot connect with {secret}")
    except RuntimeError:
        logging.getLogger("uvicorn.error").exception("Exception in ASGI application: %s", secret)
    written = capsys.readouterr().err
    assert "Exception in ASGI application" in written and "RuntimeError" in written
    assert secret not in written and REDACTED in written


# forwarding to the owning instance


def forwarded(scheme: str, owner: str) -> tuple[int, dict[str, Any]]:
    scope = {
        "type": "http", "scheme": scheme, "method": "POST", FORWARD: "/v1/jobs/j/savepoints",
        "headers": [(b"authorization", f"Bearer {ALICE}".encode())],
    }  # fmt: skip
    answer = asyncio.run(forward(owner, scope, b"{}", "", {0}))
    return answer.status_code, json.loads(answer.body)


def test_a_request_that_came_over_https_is_never_forwarded_to_a_plain_http_owner() -> None:
    status, body = forwarded("https", "http://10.0.0.7:8081")
    assert status == 503
    (message,) = body["errors"]
    assert message.startswith("the instance that owns the job (http://10.0.0.7:8081)")
    assert "refusing to forward credentials over plain http" in message
    assert ALICE not in message


# the guard, driven in memory


class Recorded:
    """An ASGI app that records the scope it was called with and answers 200."""

    def __init__(self) -> None:
        self.scope: dict[str, Any] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scope = scope
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def request(
    guard: RestGuard,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    client: str = "10.9.9.9",
    certificate: str | None = None,
) -> tuple[int, dict[str, str], Any]:
    scope: dict[str, Any] = {
        "type": "http", "method": method, "path": path, "client": (client, 50000),
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
    }  # fmt: skip
    if certificate is not None:
        cert = {"subject": ((("commonName", certificate),),)}
        scope["extensions"] = {"tls": {"client_cert_name": certificate, "client_cert": cert}}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    head = {k.decode(): v.decode() for k, v in sent[0].get("headers", [])}
    return sent[0]["status"], head, json.loads(sent[1]["body"])


def guard(security: RestSecurity, app: Recorded, access: AccessList | None = None) -> RestGuard:
    listed = access if access is not None else access_list()
    return RestGuard(app, security, lambda: listed)


TOKENS = RestSecurity(access_file=from_path("access.yaml"))


def test_the_guard_refuses_a_request_without_a_token_in_flinks_error_shape() -> None:
    app = Recorded()
    status, headers, body = request(guard(TOKENS, app), "GET", "/jobs")
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    assert list(body) == ["errors"] and "Authorization: Bearer" in body["errors"][0]
    assert app.scope is None


def test_the_guard_lets_a_read_token_read_but_not_operate() -> None:
    app = Recorded()
    bearer = {"Authorization": f"Bearer {GRAFANA}"}
    assert request(guard(TOKENS, app), "GET", "/jobs", bearer)[0] == 200
    status, _, body = request(guard(TOKENS, Recorded()), "POST", "/jobs/j/savepoints", bearer)
    assert status == 403 and "needs the operate role" in body["errors"][0]


def test_the_audited_principal_is_the_tokens_not_the_header_it_sends() -> None:
    app = Recorded()
    headers = {"Authorization": f"Bearer {ALICE}", "X-Sparkpoint-Principal": "mallory"}
    assert request(guard(TOKENS, app), "PATCH", "/jobs/j", headers)[0] == 200
    assert app.scope is not None and app.scope[PRINCIPAL] == "alice"


def test_a_trusted_proxy_names_the_principal_but_needs_its_own_credential() -> None:
    behind_proxy = RestSecurity(
        access_file=from_path("access.yaml"), trusted_proxies=(proxy_network("10.0.0.0/24"),)
    )
    app = Recorded()
    headers = {"Authorization": f"Bearer {ALICE}", "X-Sparkpoint-Principal": "bob"}
    assert request(guard(behind_proxy, app), "PATCH", "/jobs/j", headers, "10.0.0.2")[0] == 200
    assert app.scope is not None and app.scope[PRINCIPAL] == "bob"
    no_credential = {"X-Sparkpoint-Principal": "bob"}
    assert request(guard(behind_proxy, Recorded()), "PATCH", "/jobs/j", no_credential, "10.0.0.2")[0] == 401  # fmt: skip


def test_without_authentication_a_proxy_list_limits_who_names_the_principal() -> None:
    proxies_only = RestSecurity(trusted_proxies=(proxy_network("10.0.0.2"),))
    app = Recorded()
    spoofed = {"X-Sparkpoint-Principal": "bob"}
    assert request(guard(proxies_only, app), "PATCH", "/jobs/j", spoofed, "10.7.7.7")[0] == 200
    assert app.scope is not None and app.scope[PRINCIPAL] == "anonymous@10.7.7.7"
    request(guard(proxies_only, app), "PATCH", "/jobs/j", spoofed, "10.0.0.2")
    assert app.scope[PRINCIPAL] == "bob"


def test_the_pages_without_data_are_read_without_a_token() -> None:
    for path in ("/", "/openapi.json"):
        assert request(guard(TOKENS, Recorded()), "GET", path)[0] == 200
    assert request(guard(TOKENS, Recorded()), "POST", "/")[0] == 401
    assert request(guard(TOKENS, Recorded()), "GET", "/metrics")[0] == 401


def test_a_client_certificate_is_the_principal_with_mutual_tls() -> None:
    mutual = RestSecurity(
        from_path("rest.pem"), from_path("rest.key"), client_ca=from_path("ca.pem")
    )
    app = Recorded()
    assert request(guard(mutual, app, AccessList()), "PATCH", "/jobs/j", certificate="ci")[0] == 200
    assert app.scope is not None and app.scope[PRINCIPAL] == "ci"
    # mutual TLS configured, no certificate recorded (not wired in): refused, never let through
    assert request(guard(mutual, Recorded(), AccessList()), "GET", "/jobs")[0] == 401


def test_an_unreadable_access_list_answers_503() -> None:
    app = Recorded()
    refusing = RestGuard(app, TOKENS, lambda: None)
    status, _, body = request(refusing, "GET", "/jobs", {"Authorization": f"Bearer {ALICE}"})
    assert status == 503 and "access list cannot be read" in body["errors"][0]
