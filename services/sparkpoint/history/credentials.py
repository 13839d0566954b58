"""The history service's Kafka credentials: the librdkafka properties every sparkpoint process
reads (`sparkpoint.common.kafka_config`), said the way faust and aiokafka take them.

aiokafka speaks PLAINTEXT, SSL, SASL_PLAINTEXT and SASL_SSL with PLAIN and SCRAM-SHA-256/512;
a property it cannot honour (another mechanism, a PKCS#12 keystore) is refused naming the key,
rather than connecting with less than the operator asked for."""

from __future__ import annotations

import ssl
from collections.abc import Mapping

import faust
from faust.types.auth import CredentialsT

from sparkpoint.common.kafka_config import KafkaConfigError

SUPPORTED_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

UNSUPPORTED = {
    "ssl.keystore.location": "give ssl.certificate.location and ssl.key.location (PEM)",
    "ssl.certificate.pem": "give ssl.certificate.location (a file)",
    "ssl.key.pem": "give ssl.key.location (a file)",
    "ssl.ca.pem": "give ssl.ca.location (a file)",
}
"""librdkafka properties aiokafka has no way to take, and what to give instead."""


def faust_credentials(properties: Mapping[str, str]) -> CredentialsT | None:
    """faust's broker credentials for ``properties``; None for a plaintext cluster."""
    protocol = properties.get("security.protocol", "PLAINTEXT").upper()
    for key, instead in UNSUPPORTED.items():
        if key in properties:
            raise KafkaConfigError(f"the history service cannot use {key}: {instead}")
    context = _ssl_context(properties) if protocol in ("SSL", "SASL_SSL") else None
    if protocol == "PLAINTEXT":
        return None
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    if protocol not in ("SASL_PLAINTEXT", "SASL_SSL"):
        raise KafkaConfigError(f"security.protocol={protocol} is not a Kafka security protocol")
    mechanism = properties.get("sasl.mechanism", properties.get("sasl.mechanisms", "GSSAPI"))
    if mechanism.upper() not in SUPPORTED_MECHANISMS:
        raise KafkaConfigError(
            f"the history service (aiokafka) cannot use sasl.mechanism={mechanism}: it takes "
            f"{', '.join(SUPPORTED_MECHANISMS)}"
        )
    return faust.SASLCredentials(
        username=properties.get("sasl.username"),
        password=properties.get("sasl.password"),
        ssl_context=context,
        mechanism=mechanism.upper(),
    )


def _ssl_context(properties: Mapping[str, str]) -> ssl.SSLContext:
    """As librdkafka verifies: the broker's certificate against ``ssl.ca.location`` (else the
    system's CAs) and its host name, unless told otherwise."""
    context = ssl.create_default_context(cafile=properties.get("ssl.ca.location"))
    if properties.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
        context.check_hostname = False
    if properties.get("enable.ssl.certificate.verification", "true").lower() == "false":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if "ssl.certificate.location" in properties:
        context.load_cert_chain(
            properties["ssl.certificate.location"],
            properties.get("ssl.key.location"),
            properties.get("ssl.key.password"),
        )
    return context
