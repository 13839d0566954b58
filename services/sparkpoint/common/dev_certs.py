"""A throwaway certificate authority and its certificates, for trying TLS on one machine or one
Docker host: the embedded broker's TLS (`sparkpoint broker --dev-tls`), ``sparkpoint demo
--secure`` and docker-compose.secure.yml's Kafka and coordinators. Never for production: the CA
is made afresh, kept nowhere safer than the files it signed, and no one but you trusts it (its
key is not kept: nothing else can be signed with it later).

Writes PEM files (what librdkafka, Python's ssl module, uvicorn and Kafka's ``ssl.*.type=PEM``
read): ``ca.pem`` (the CA certificate, to trust), ``server.pem`` (the server's key and
certificate chain, for every host name given), and per client ``<name>.pem`` (certificate) and
``<name>.key`` (key), its subject's common name the client's name. Made with ``cryptography``.

Run as ``python -m sparkpoint.common.dev_certs DIR --host kafka --host localhost --client agent``.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 365


@dataclass(frozen=True)
class DevCerts:
    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def server(self) -> Path:
        """The server's private key followed by its certificate (one file, as tansu's front,
        uvicorn and Kafka's PEM keystore take it)."""
        return self.directory / "server.pem"

    def client_cert(self, name: str) -> Path:
        return self.directory / f"{name}.pem"

    def client_key(self, name: str) -> Path:
        return self.directory / f"{name}.key"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    extensions: list[tuple[x509.ExtensionType, bool]],
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, signer = issuer if issuer is not None else (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )
    # what strict X.509 verification (OpenSSL's -x509_strict, Python 3.13's default) requires:
    # key usage, and key identifiers linking each certificate to its issuer
    ca = issuer is None
    usage = x509.KeyUsage(
        digital_signature=not ca, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip
    builder = builder.add_extension(usage, True).add_extension(
        x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False
    )
    builder = builder.add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), False
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical)
    return builder.sign(signer, hashes.SHA256())


def _alternative_names(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def make_dev_certs(directory: Path, hosts: list[str], clients: list[str]) -> DevCerts:
    """A new CA in ``directory``, a server certificate for ``hosts`` and one per client."""
    directory.mkdir(parents=True, exist_ok=True)
    certs = DevCerts(directory)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate(
        "sparkpoint development CA", ca_key, None,
        [(x509.BasicConstraints(ca=True, path_length=0), True)],
    )  # fmt: skip
    signer = (ca.subject, ca_key)
    certs.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _certificate(
        hosts[0], server_key, signer,
        [
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (_alternative_names(hosts), False),
            # client too: a coordinator under mutual TLS presents its server certificate when
            # it calls another instance or the history service
            (x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ), False),
        ],
    )  # fmt: skip
    certs.server.touch(mode=0o600)
    certs.server.write_bytes(_key_pem(server_key) + server.public_bytes(serialization.Encoding.PEM))

    for name in clients:
        key = ec.generate_private_key(ec.SECP256R1())
        client = _certificate(
            name, key, signer,
            [
                (x509.BasicConstraints(ca=False, path_length=None), True),
                (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False),
            ],
        )  # fmt: skip
        certs.client_cert(name).write_bytes(client.public_bytes(serialization.Encoding.PEM))
        certs.client_key(name).touch(mode=0o600)
        certs.client_key(name).write_bytes(_key_pem(key))
    return certs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--host", action="append", default=[], help="a server host name or IP")
    parser.add_argument("--client", action="append", default=[], help="a client's name (its CN)")
    args = parser.parse_args(argv)
    made = make_dev_certs(args.directory, args.host or ["localhost", "127.0.0.1"], args.client)
    print(f"CA {made.ca}, server {made.server}, clients: {', '.join(args.client) or 'none'}")


if __name__ == "__main__":
    main()
