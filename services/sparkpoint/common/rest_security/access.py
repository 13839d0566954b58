"""Who may do what on a REST API: the two roles, the access list (bearer tokens by their SHA-256,
client certificates by name) and the decision for one request. Pure: no I/O, no clock.

A request is judged in this order:

1. A bearer token (``Authorization: Bearer ...``), when one is sent, names the principal; an
   unknown one is refused (401) even when a trusted client certificate came with it: a
   credential that was presented and is wrong is never silently replaced by another.
2. Else the client certificate (mutual TLS) names the principal: its subject CN (`certificate
   _name`), with the role the access list gives that name, else its default certificate role.
3. Else the request is refused: 401, ``WWW-Authenticate: Bearer``.
4. The principal's role must allow the method: ``read`` allows GET, HEAD and OPTIONS,
   ``operate`` everything; otherwise 403.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""What the ``read`` role may send: nothing that changes a job."""

MIN_TOKEN_LENGTH = 16
"""A token written in clear in the access list is at least this long: a short one can be
guessed by trying."""

MAX_PRINCIPAL = 200
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


class Role(enum.Enum):
    READ = "read"
    OPERATE = "operate"

    def allows(self, method: str) -> bool:
        return self is Role.OPERATE or method.upper() in READ_METHODS


def needed_role(method: str) -> Role:
    return Role.READ if method.upper() in READ_METHODS else Role.OPERATE


@dataclass(frozen=True)
class Identity:
    """An authenticated caller: its principal, its role, and how it proved who it is."""

    principal: str
    role: Role
    credential: str
    """``token`` or ``certificate``."""


@dataclass(frozen=True)
class Refusal:
    """A request that may not go on: Flink's error body with ``message``, and for a 401 the
    ``WWW-Authenticate`` challenge."""

    status: int
    message: str
    challenge: str | None = None

    def body(self) -> bytes:
        """Flink's error body: ``{"errors": [message]}``."""
        return json.dumps({"errors": [self.message]}).encode()


class AccessListError(ValueError):
    """The access list cannot be used; the message names its file and what is wrong."""


def token_digest(token: str) -> str:
    """What the access list keeps of a token: its SHA-256, hex (``printf %s TOKEN | sha256sum``)."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class AccessList:
    """Bearer tokens (by their SHA-256) and client certificates (by name), each with a role.

    ``certificate_role``: the role of a trusted certificate whose name is not listed (None: such
    a certificate is refused). By default it is ``operate``: as with Flink's
    ``security.ssl.rest.authentication-enabled``, the client CA is the grant, so only certificates
    meant to operate should come from it."""

    tokens: Mapping[str, Identity] = field(default_factory=dict)
    certificates: Mapping[str, Role] = field(default_factory=dict)
    certificate_role: Role | None = Role.OPERATE
    clear_tokens: tuple[str, ...] = ()
    """The tokens written in clear (to be scrubbed from logs)."""

    def by_token(self, token: str) -> Identity | None:
        return self.tokens.get(token_digest(token))

    def by_certificate(self, name: str) -> Identity | None:
        role = self.certificates.get(name, self.certificate_role)
        return None if role is None else Identity(name, role, "certificate")


def parse_access_list(data: Any, source: str) -> AccessList:
    """The access list from a parsed file (YAML or JSON)::

        tokens:
          - {principal: alice, role: operate, sha256: <64 hex digits>}
          - {principal: grafana, role: read, token: <the token in clear>}
        certificates: {ci-pipeline: operate, oncall: read}
        certificate-default-role: none

    ``source`` (the file) begins every error message. A document with neither ``tokens`` nor
    ``certificates`` (an empty or comment-only file, or one caught while an editor rewrites it
    in place) is an error, not an empty list: such a list would leave every certificate of the
    client CA its default role, ``operate``, when the file meant to grant less. A list meant to
    hold no token says so: ``tokens: []``."""
    if not isinstance(data, dict | None):
        raise AccessListError(f"{source}: expected a mapping with tokens and certificates")
    unknown = set(data or ()) - {"tokens", "certificates", "certificate-default-role"}
    if unknown:
        raise AccessListError(
            f"{source}: unknown key {sorted(unknown)[0]!r} (known: tokens, certificates, "
            "certificate-default-role)"
        )
    if not data or not {"tokens", "certificates"} & set(data):
        raise AccessListError(
            f"{source}: neither tokens nor certificates (an empty or half-written file?); "
            "every request is refused until it lists them (tokens: [] for none)"
        )
    tokens, clear = _tokens(_or(data.get("tokens"), []), source)
    certificates = _certificates(_or(data.get("certificates"), {}), source)
    default = data.get("certificate-default-role", Role.OPERATE.value)
    if default in (None, "none"):
        default_role = None
    else:
        default_role = _role(default, f"{source}: certificate-default-role")
    return AccessList(tokens, certificates, default_role, tuple(clear))


def _or(value: Any, empty: Any) -> Any:
    """``value``, or ``empty`` when the key is there with nothing after it (YAML's null)."""
    return empty if value is None else value


def _role(value: Any, where: str) -> Role:
    try:
        return Role(value)
    except ValueError:
        raise AccessListError(f"{where}: role {value!r} is neither read nor operate") from None


def _principal(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise AccessListError(f"{where}: principal must be a non-empty string")
    if len(value) > MAX_PRINCIPAL or not value.isprintable():
        raise AccessListError(
            f"{where}: principal must be printable and at most {MAX_PRINCIPAL} characters"
        )
    return value


def _tokens(entries: Any, source: str) -> tuple[dict[str, Identity], list[str]]:
    if not isinstance(entries, list):
        raise AccessListError(f"{source}: tokens must be a list")
    tokens: dict[str, Identity] = {}
    clear: list[str] = []
    for number, entry in enumerate(entries, 1):
        where = f"{source}: tokens entry {number}"
        if not isinstance(entry, dict):
            raise AccessListError(f"{where}: expected a mapping with principal, role, sha256")
        unknown = set(entry) - {"principal", "role", "sha256", "token"}
        if unknown:
            raise AccessListError(f"{where}: unknown key {sorted(unknown)[0]!r}")
        principal = _principal(entry.get("principal"), where)
        role = _role(entry.get("role"), where)
        if ("sha256" in entry) == ("token" in entry):
            raise AccessListError(f"{where} ({principal}): give exactly one of sha256 and token")
        if "token" in entry:
            token = entry["token"]
            if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH:
                raise AccessListError(
                    f"{where} ({principal}): token must be a string of at least "
                    f"{MIN_TOKEN_LENGTH} characters"
                )
            clear.append(token)
            digest = token_digest(token)
        else:
            digest = str(entry["sha256"]).strip().lower()
            if not _HEX_DIGEST.fullmatch(digest):
                raise AccessListError(
                    f"{where} ({principal}): sha256 must be 64 hex digits "
                    "(printf %s TOKEN | sha256sum)"
                )
        if digest in tokens:
            raise AccessListError(
                f"{where} ({principal}): the same token as {tokens[digest].principal}"
            )
        tokens[digest] = Identity(principal, role, "token")
    return tokens, clear


def _certificates(entries: Any, source: str) -> dict[str, Role]:
    if not isinstance(entries, dict):
        raise AccessListError(f"{source}: certificates must map a certificate's name to a role")
    return {
        _principal(name, f"{source}: certificates"): _role(role, f"{source}: certificates.{name}")
        for name, role in entries.items()
    }


def certificate_name(certificate: Mapping[str, Any]) -> str | None:
    """The principal a client certificate names (``ssl.SSLSocket.getpeercert()``'s shape): its
    subject's common name (CN), else its first subject alternative name (DNS, e-mail or URI)."""
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return str(value)
    for kind, value in certificate.get("subjectAltName", ()):
        if kind in ("DNS", "email", "URI") and value:
            return str(value)
    return None


BEARER_CHALLENGE = 'Bearer realm="sparkpoint"'


def authenticate(
    authorization: str | None, certificate: str | None, access: AccessList | None
) -> Identity | Refusal:
    """Who sends a request: from its ``Authorization`` header, else its client certificate's
    name (`certificate_name`). ``access``: None while the access list's file cannot be read:
    every request is then refused (503) until it can, so a broken edit never keeps a revoked
    token working."""
    if access is None:
        return Refusal(503, "authentication is unavailable: the access list cannot be read")
    if authorization is not None:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return Refusal(
                401,
                "Authorization: only bearer tokens are accepted (Authorization: Bearer <token>)",
                BEARER_CHALLENGE + ', error="invalid_request"',
            )
        identity = access.by_token(token.strip())
        if identity is None:
            return Refusal(
                401,
                "the bearer token is not valid (unknown, or revoked)",
                BEARER_CHALLENGE + ', error="invalid_token"',
            )
        return identity
    if certificate is not None:
        identity = access.by_certificate(certificate)
        if identity is None:
            return Refusal(403, f"the client certificate {certificate!r} is not admitted")
        return identity
    return Refusal(
        401,
        "authentication required: send Authorization: Bearer <token>",
        BEARER_CHALLENGE,
    )


def authorize(identity: Identity, method: str, path: str) -> Refusal | None:
    """None when ``identity``'s role allows ``method``; else a 403 naming what was missing."""
    if identity.role.allows(method):
        return None
    needed = needed_role(method)
    return Refusal(
        403,
        f"{identity.principal} has the {identity.role.value} role; {method} {path} needs the "
        f"{needed.value} role",
    )
