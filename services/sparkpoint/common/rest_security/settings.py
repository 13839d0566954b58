"""A REST endpoint's security settings (`RestSecurity`): TLS, the access list's file, the trusted
proxies; from a service's command-line flags and from the keys of its YAML configuration."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkpoint.common.rest_security.access import AccessListError
from sparkpoint.common.rest_security.tls import TlsError, TlsFiles

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

OPTION_KEYS = {
    "security.ssl.rest.certificate": "certificate",
    "security.ssl.rest.private-key": "private_key",
    "security.ssl.rest.client-ca": "client_ca",
    "security.rest.access-file": "access_file",
    "security.rest.trusted-proxies": "trusted_proxies",
}
"""The keys of a service's YAML configuration (Flink's ``security.ssl.rest`` family, with PEM
files where Flink takes Java keystores), and the setting each names."""


class SecuritySettingsError(ValueError):
    """The settings cannot be used; the message names the flag or key, or the file."""


def proxy_network(text: str) -> Network:
    """An address (``10.0.0.5``) or a network (``10.0.0.0/24``) of trusted proxies."""
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise SecuritySettingsError(
            f"trusted proxy {text!r}: not an IP address or network (10.0.0.5, 10.0.0.0/24)"
        ) from None


@dataclass(frozen=True)
class RestSecurity:
    """How a REST endpoint is secured. Nothing set: plain HTTP, no authentication, the
    ``X-Sparkpoint-Principal`` header believed as before."""

    certificate: Path | None = None
    private_key: Path | None = None
    client_ca: Path | None = None
    access_file: Path | None = None
    trusted_proxies: tuple[Network, ...] = ()

    @property
    def tls(self) -> TlsFiles | None:
        if self.certificate is None or self.private_key is None:
            return None
        return TlsFiles(self.certificate, self.private_key, self.client_ca)

    @property
    def authenticates(self) -> bool:
        """Whether every request must prove who sends it (a token, or a client certificate)."""
        return self.access_file is not None or self.client_ca is not None

    @property
    def configured(self) -> bool:
        return self.tls is not None or self.authenticates or bool(self.trusted_proxies)

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any], source: str = "the configuration"
    ) -> RestSecurity:
        """The settings among a service's (flattened) YAML options; other families ignored, an
        unknown key of these families refused naming the known ones."""
        found: dict[str, Any] = {}
        for key, value in options.items():
            if not key.startswith(("security.ssl.rest.", "security.rest.")):
                continue
            if key not in OPTION_KEYS:
                raise SecuritySettingsError(_unknown_key(key, source))
            found[OPTION_KEYS[key]] = value
        proxies = found.pop("trusted_proxies", None) or []
        if isinstance(proxies, str):
            proxies = proxies.split(",")
        paths = {name: Path(str(value)) for name, value in found.items() if value not in (None, "")}
        return cls(**paths, trusted_proxies=tuple(proxy_network(str(p)) for p in proxies))

    def over(self, base: RestSecurity) -> RestSecurity:
        """These settings where given, ``base``'s (say, the YAML file's) elsewhere."""
        return RestSecurity(
            self.certificate or base.certificate,
            self.private_key or base.private_key,
            self.client_ca or base.client_ca,
            self.access_file or base.access_file,
            self.trusted_proxies or base.trusted_proxies,
        )

    def check(self) -> None:
        """Every file usable; raises `SecuritySettingsError` naming what is not."""
        if (self.certificate is None) != (self.private_key is None):
            raise SecuritySettingsError(
                "--rest-tls-cert and --rest-tls-key go together (security.ssl.rest.certificate "
                "and security.ssl.rest.private-key)"
            )
        if self.client_ca is not None and self.tls is None:
            raise SecuritySettingsError(
                "--rest-tls-client-ca (mutual TLS) needs --rest-tls-cert and --rest-tls-key"
            )
        tls = self.tls
        try:
            if tls is not None:
                tls.server_context()
            if self.access_file is not None:
                from sparkpoint.common.rest_security.access_file import read_access_list

                read_access_list(self.access_file)
        except (TlsError, AccessListError) as exc:
            raise SecuritySettingsError(str(exc)) from None

    def uvicorn_options(self) -> dict[str, Any]:
        """``uvicorn.Config`` keywords: TLS when configured; and, once anything is configured,
        no ``X-Forwarded-For`` rewriting of the client's address, which decides whether a
        request comes from a trusted proxy."""
        if not self.configured:
            return {}
        options: dict[str, Any] = {"proxy_headers": False}
        tls = self.tls
        if tls is not None:
            options |= tls.uvicorn_options()
        return options

    def describe(self) -> str:
        """One line for the service's start-up message (file names, no secret)."""
        parts = []
        if self.tls is None:
            parts.append("plain HTTP")
        elif self.client_ca is not None:
            parts.append(f"TLS, client certificates from {self.client_ca} required")
        else:
            parts.append("TLS")
        if self.access_file is not None:
            parts.append(f"bearer tokens from {self.access_file}")
            if self.tls is None:
                parts.append("WARNING: tokens travel in clear without TLS (or a TLS proxy)")
        if not self.authenticates:
            parts.append("no authentication")
        if self.trusted_proxies:
            parts.append(
                "principal header trusted from " + ", ".join(map(str, self.trusted_proxies))
            )
        return "; ".join(parts)


def _unknown_key(key: str, source: str) -> str:
    if key.rsplit(".", 1)[-1].split("-")[0] in ("keystore", "truststore", "key"):
        hint = (
            "sparkpoint takes PEM files: security.ssl.rest.certificate, "
            "security.ssl.rest.private-key, security.ssl.rest.client-ca"
        )
    else:
        hint = "known: " + ", ".join(OPTION_KEYS)
    return f"{source}: unknown key {key} ({hint})"


def trusted(address: str | None, proxies: Iterable[Network]) -> bool:
    """Whether a request from ``address`` comes from a trusted proxy."""
    if address is None:
        return False
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in proxies)
