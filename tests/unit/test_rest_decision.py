"""What a secured REST endpoint does with one request (`decision.judge`), whichever server carries
it, and the history service's use of it (`sparkpoint.history.security`): pure, no socket, no
file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.common.rest_security import RestSecurity, Role
from sparkpoint.common.rest_security.access import AccessList, Identity, Refusal
from sparkpoint.common.rest_security.access_file import access_source
from sparkpoint.common.rest_security.decision import Admitted, Asked, judge
from sparkpoint.common.rest_security.guard import PUBLIC_PAGES
from sparkpoint.common.rest_security.settings import proxy_network
from sparkpoint.history.security import PUBLIC_PAGES as HISTORY_PAGES
from sparkpoint.history.security import refused, web_options
from tests.unit.test_rest_security import ALICE, GRAFANA
from tests.unit.test_rest_security import access_list as listed

pytestmark = pytest.mark.unit


TOKENS = RestSecurity(access_file=Path("access.yaml"))  # no file is read: judge does no I/O
MUTUAL = RestSecurity(Path("rest.pem"), Path("rest.key"), client_ca=Path("ca.pem"))


def bearer(token: str) -> str:
    return f"Bearer {token}"


def with_certificate(name: str) -> dict[str, Any]:
    """The ASGI TLS extension of a connection whose client certificate names ``name``."""
    return {"client_cert_name": name, "client_cert": {"subject": ((("commonName", name),),)}}


def judged(
    security: RestSecurity,
    asked: Asked,
    access: AccessList | None = None,
    public: frozenset[str] = PUBLIC_PAGES,
    read_only: bool = False,
) -> Admitted | Refusal:
    current = access if access is not None else listed()
    return judge(security, lambda: current, asked, public, read_only)


def test_without_authentication_every_request_is_anonymous_from_its_peer() -> None:
    asked = Asked("DELETE", "/jobs/j", "10.1.1.1", principal_header="bob")
    assert judged(RestSecurity(), asked) == Admitted("anonymous@10.1.1.1")
    proxied = RestSecurity(trusted_proxies=(proxy_network("10.1.1.0/24"),))
    assert judged(proxied, asked) == Admitted("bob")


def test_with_tls_alone_the_principal_header_of_an_untrusted_caller_is_no_identity() -> None:
    asked = Asked("DELETE", "/jobs/j", "10.1.1.1", principal_header="bob")
    assert judged(RestSecurity(Path("rest.pem"), Path("rest.key")), asked) == Admitted(
        "anonymous@10.1.1.1"
    )


def test_a_public_page_is_read_by_no_one_in_particular_without_asking_the_access_list() -> None:
    def unreadable() -> AccessList | None:
        raise AssertionError("the access list was asked for a public page")

    asked = Asked("GET", "/", "10.1.1.1")
    assert judge(TOKENS, unreadable, asked, PUBLIC_PAGES) == Admitted(None)


def test_a_public_path_is_public_only_to_reads() -> None:
    refusal = judged(TOKENS, Asked("POST", "/", "10.1.1.1"))
    assert isinstance(refusal, Refusal) and refusal.status == 401
    assert refusal.challenge is not None and refusal.challenge.startswith("Bearer")


def test_a_token_is_the_principal_and_its_role_must_allow_the_method() -> None:
    alice = Identity("alice", Role.OPERATE, "token")
    admitted = judged(TOKENS, Asked("PATCH", "/jobs/j", "10.1.1.1", bearer(ALICE), "mallory"))
    assert admitted == Admitted("alice", alice)
    refusal = judged(TOKENS, Asked("PATCH", "/jobs/j", "10.1.1.1", bearer(GRAFANA)))
    assert isinstance(refusal, Refusal) and refusal.status == 403
    assert "PATCH /jobs/j needs the operate role" in refusal.message


def test_on_a_read_only_endpoint_the_read_role_passes_every_method_on() -> None:
    """The history service: what it does not serve gets the server's own 404 or 405."""
    grafana = Identity("grafana", Role.READ, "token")
    asked = Asked("POST", "/jobs/overview", "10.1.1.1", bearer(GRAFANA))
    assert judged(TOKENS, asked, read_only=True) == Admitted("grafana", grafana)
    anonymous = judged(TOKENS, Asked("POST", "/jobs/overview", "10.1.1.1"), read_only=True)
    assert isinstance(anonymous, Refusal) and anonymous.status == 401


def test_a_trusted_proxy_names_the_user_it_vouches_for() -> None:
    behind = RestSecurity(access_file=Path("a.yaml"), trusted_proxies=(proxy_network("10.0.0.2"),))
    asked = Asked("PATCH", "/jobs/j", "10.0.0.2", bearer(ALICE), "bob")
    admitted = judged(behind, asked)
    assert isinstance(admitted, Admitted) and admitted.principal == "bob"
    assert admitted.on_behalf == "bob" and admitted.identity is not None
    assert admitted.identity.principal == "alice"


def test_under_mutual_tls_the_certificate_is_the_principal_and_none_is_refused() -> None:
    asked = Asked("GET", "/jobs", "10.1.1.1", tls=with_certificate("oncall"))
    admitted = judged(MUTUAL, asked, AccessList())
    assert admitted == Admitted("oncall", Identity("oncall", Role.OPERATE, "certificate"))
    unrecorded: tuple[dict[str, Any] | None, ...] = (
        None,
        {"client_cert_name": None, "client_cert": {}},
    )
    for tls in unrecorded:
        refusal = judged(MUTUAL, Asked("GET", "/jobs", "10.1.1.1", tls=tls), AccessList())
        assert isinstance(refusal, Refusal) and refusal.status == 401
        assert refusal.message == "no client certificate was presented"


def test_a_certificate_without_a_name_is_refused() -> None:
    tls = {"client_cert_name": None, "client_cert": {"subject": ()}}
    refusal = judged(MUTUAL, Asked("GET", "/jobs", "10.1.1.1", tls=tls), AccessList())
    assert isinstance(refusal, Refusal) and "names no principal" in refusal.message


def test_a_certificate_the_list_does_not_admit_is_refused_by_name() -> None:
    closed = listed(certificates={"oncall": "read"}, **{"certificate-default-role": "none"})
    refusal = judged(MUTUAL, Asked("GET", "/jobs", "10.1.1.1", tls=with_certificate("eve")), closed)
    assert isinstance(refusal, Refusal) and refusal.status == 403
    assert refusal.message == "the client certificate 'eve' is not admitted"


def test_an_unreadable_access_list_refuses_with_503() -> None:
    refusal = judge(TOKENS, lambda: None, Asked("GET", "/jobs", "10.1.1.1", bearer(ALICE)), ())
    assert isinstance(refusal, Refusal) and refusal.status == 503


def test_a_refusal_is_flinks_error_body() -> None:
    assert json.loads(Refusal(403, "no").body()) == {"errors": ["no"]}


def test_without_an_access_file_certificates_are_admitted_by_the_default_role() -> None:
    current = access_source(None)()
    assert current is not None and current.by_certificate("ci") == Identity(
        "ci", Role.OPERATE, "certificate"
    )


# the history service


def test_the_history_leaves_open_its_dashboard_page_and_health_only() -> None:
    assert sorted(HISTORY_PAGES) == ["/", "/history/status"]
    grafana = Identity("grafana", Role.READ, "token")
    for page in ("/jobs/overview", "/jobs/j/history", "/table/jobs/"):
        refusal = judged(TOKENS, Asked("GET", page, "10.1.1.1"), public=HISTORY_PAGES)
        assert isinstance(refusal, Refusal) and refusal.status == 401
        asked = Asked("GET", page, "10.1.1.1", bearer(GRAFANA))
        assert judged(TOKENS, asked, public=HISTORY_PAGES, read_only=True) == Admitted(
            "grafana", grafana
        )


def test_the_history_answers_a_refusal_as_the_coordinator_does() -> None:
    challenge = 'Bearer realm="sparkpoint"'
    answer = refused(Refusal(401, "authentication required", challenge))
    assert answer.status == 401 and answer.headers["WWW-Authenticate"] == challenge
    assert answer.content_type == "application/json"
    assert answer.body == b'{"errors": ["authentication required"]}'
    assert "WWW-Authenticate" not in refused(Refusal(503, "unavailable")).headers


def test_an_unsecured_history_gets_no_web_setting() -> None:
    assert web_options(RestSecurity()) == {}
