"""One Kafka client configuration for every sparkpoint process and task.

A librdkafka properties file (``key=value`` lines, as Kafka's ``--command-config`` and kcat's
``-F`` take) holds what a secured cluster needs: ``security.protocol``, the SASL mechanism and
credentials, the CA, a client certificate. ``--kafka-config FILE`` or ``SPARKPOINT_KAFKA_CONFIG``
names it; every producer, consumer and admin client sparkpoint makes starts from it, and the
agent hands the same properties (with a source's or sink's own on top) to the Spark tasks that
read and write Kafka, inside the task rather than in Spark's configuration, so they appear
neither on Spark's environment page nor in its event log.

The file is read exactly as Java's ``Properties.load`` reads it (`java_properties`), so a file
written for Kafka's own tools means the same here. A value may name an environment variable,
``${env:NAME}`` (Kafka's EnvVarConfigProvider), so the file itself can be kept free of secrets.
Every value whose key names a secret is registered with `sparkpoint.common.redaction` as soon as
it is loaded, and no error this module raises ever quotes a value or a line: it names the file,
the line and the key.

Java clients' ``sasl.jaas.config`` for the PLAIN and SCRAM login modules is read as librdkafka's
``sasl.username`` and ``sasl.password``; the Java-only truststore keys and a Java (JKS) keystore
are refused with what to give instead; the keys sparkpoint sets itself are refused with why.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from sparkpoint.common.redaction import is_secret, register_secrets, secrets_of

log = logging.getLogger(__name__)

CONFIG_ENV = "SPARKPOINT_KAFKA_CONFIG"
"""Names the properties file when ``--kafka-config`` is not given; the `sparkpoint` command sets
it for the processes it starts (the demo's coordinator and agent), so they read the same file."""

JAVA_ONLY = {
    "ssl.truststore.location": "ssl.ca.location (a PEM file of the CA certificates)",
    "ssl.truststore.password": "ssl.ca.location (PEM needs no password)",
    "ssl.truststore.type": "ssl.ca.location (PEM)",
    "ssl.truststore.certificates": "ssl.ca.pem (or ssl.ca.location, a file)",
    "ssl.keystore.certificate.chain": "ssl.certificate.pem (or ssl.certificate.location, a file)",
    "ssl.keystore.key": "ssl.key.pem (or ssl.key.location, a file)",
    "sasl.login.callback.handler.class": "sasl.oauthbearer.method=oidc and its settings",
}
"""Keys of Java's client with no librdkafka equivalent of the same name, and what to use. The
keystore is not here: librdkafka's ``ssl.keystore.location`` takes a PKCS#12 file, so only a Java
(JKS) keystore is refused (`KEYSTORE_CONVERSION`)."""

KEYSTORE_CONVERSION = (
    "convert it to PKCS#12 (keytool -importkeystore -srckeystore client.jks -destkeystore "
    "client.p12 -deststoretype PKCS12) and give that file as ssl.keystore.location with "
    "ssl.keystore.password, or to PEM files given as ssl.certificate.location and "
    "ssl.key.location"
)
"""What to do with a Java keystore: librdkafka's keystore is PKCS#12 ("Path to client's keystore
(PKCS#12)", CONFIGURATION.md), and its certificate and key may also be PEM files."""

SPARKPOINT_OWNS = {
    "transactional.id": "sparkpoint gives each transactional writer its own fixed id (one from "
    "the file would make every producer transactional, all with the same id)",
    "enable.idempotence": "sparkpoint's producers are always idempotent (acks=all)",
    "group.id": "sparkpoint names its consumer groups itself, under the topic prefix "
    "(docs/security.md lists them for the ACLs)",
    "enable.auto.commit": "sparkpoint never auto-commits: it keeps positions where it needs them",
    "isolation.level": "sparkpoint reads read_committed where its guarantees need it",
}
"""Keys sparkpoint sets on its clients itself (`sparkpoint.common.kafka`): refused in the file
rather than silently overridden, or worse, as ``transactional.id`` would be, applied.
``bootstrap.servers`` is not here: the file's is the last fallback of
`sparkpoint.common.kafka.bootstrap_servers` (after ``--bootstrap`` and
``KAFKA_BOOTSTRAP_SERVERS``), as ``--bootstrap``'s help says."""

_ENV = re.compile(r"\$\{env:(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}")


class KafkaConfigError(ValueError):
    """The Kafka client configuration cannot be used; the message names the file, the line and
    the key, never a value."""


# --- Java's Properties.load ----------------------------------------------------------------------

_BLANK = " \t\f"
"""White space to Properties.load: space, tab and form feed (not \\v, not Unicode spaces)."""

_LINE_END = re.compile(r"\r\n|\r|\n")
"""Properties.load ends a natural line at \\n, \\r or \\r\\n only."""

_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_ESCAPED = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


@dataclass(frozen=True)
class Property:
    """One key and value of a properties file, escapes processed."""

    line: int
    """The number of the natural line its logical line starts on."""
    key: str
    value: str
    blank_end: bool
    """The value ends in white space the file did not escape: kept, as Properties.load keeps it,
    but rarely meant (a password with a trailing space)."""
    alone: bool = False
    """The line holds the key alone: no ``=`` or ``:``, nothing after it."""


class _Malformed(ValueError):
    """A ``\\u`` escape without four hexadecimal digits, or half of a surrogate pair."""


def java_properties(text: str, source: str) -> list[Property]:
    """The properties of ``text`` in file order, read exactly as java.util.Properties.load reads
    them (a later key wins when they are made a dict):

    1. Natural lines end at ``\\n``, ``\\r`` or ``\\r\\n``; their leading spaces, tabs and form
       feeds are ignored; a blank line is skipped, and so is a comment, a line whose first
       other character is ``#`` or ``!`` (a comment never continues).
    2. A natural line ending in an odd number of backslashes continues on the next: that
       backslash goes, and so does the next line's leading white space (an even number is
       escaped backslashes). The last line of the file may end so; it is still taken.
    3. The key runs to the first unescaped ``=``, ``:`` or white space; white space, at most one
       ``=`` or ``:`` and white space again separate it from the value, which is the rest of the
       line, trailing white space kept. A line with only a key gives it an empty value.
    4. In key and value, ``\\t \\n \\r \\f`` and ``\\uXXXX`` are those characters and a backslash
       before any other character is that character (``\\=``, ``\\:``, ``\\ ``, ``\\#``, ``\\\\``).

    A line with no key (it starts with ``=`` or ``:``) and a malformed ``\\uXXXX`` are errors
    naming ``source``, the line and the key, never the value."""
    properties = []
    for number, line in _logical_lines(text):
        raw_key, raw_value = _split(line)
        where = f"{source}:{number}"
        if not raw_key:
            raise KafkaConfigError(f"{where}: a line with no key")
        try:
            key = _unescape(raw_key)
        except _Malformed as exc:
            raise KafkaConfigError(f"{where}: the key has a malformed {exc}") from None
        try:
            value = _unescape(raw_value)
        except _Malformed as exc:
            raise KafkaConfigError(f"{where}: {key}: the value has a malformed {exc}") from None
        alone = not raw_value and not line[len(raw_key) :].strip(_BLANK)
        properties.append(Property(number, key, value, _ends_blank(raw_value), alone))
    return properties


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(number of its first natural line, text) of each logical line that holds a property. As
    in Java 9 and later, a logical line still empty after a lone ``\\`` may yet be a comment. A
    lone ``\\`` ending the text is no line (Java gives it the empty key, or not, depending on
    the line end before the end of the text; an empty key is refused here anyway)."""
    natural = _LINE_END.split(text)
    if natural[-1] == "":  # the text's last line end; a line after it would have text
        natural.pop()
    logical, start, continued = "", 0, False
    for number, raw in enumerate(natural, start=1):
        line = raw.lstrip(_BLANK)
        if not logical:
            start = number
            if line.startswith(("#", "!")):
                continued = False
                continue
        continued = _continues(line)
        logical += line[:-1] if continued else line
        if not continued:
            if logical:
                yield start, logical
            logical = ""
    if continued and logical:
        yield start, logical


def _continues(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _split(line: str) -> tuple[str, str]:
    """The key and value of a logical line, still escaped."""
    key_end = len(line)
    separated = False
    escaped = False
    for at, char in enumerate(line):
        if not escaped and (char in "=:" or char in _BLANK):
            key_end, separated = at, char in "=:"
            break
        escaped = char == "\\" and not escaped
    value = line[key_end + 1 :].lstrip(_BLANK)
    if not separated and value.startswith(("=", ":")):
        value = value[1:].lstrip(_BLANK)
    return line[:key_end], value


def _unescape(raw: str) -> str:
    if "\\" not in raw:
        return raw
    out: list[str] = []
    at = 0
    while at < len(raw):
        char = raw[at]
        at += 1
        if char != "\\" or at == len(raw):  # a lone final backslash cannot be: it continued
            out.append(char)
            continue
        char = raw[at]
        at += 1
        if char == "u":
            digits = raw[at : at + 4]
            if not _HEX4.fullmatch(digits):
                raise _Malformed("\\uXXXX escape (four hexadecimal digits)")
            out.append(chr(int(digits, 16)))
            at += 4
        else:
            out.append(_ESCAPED.get(char, char))
    text = "".join(out)
    if any("\ud800" <= c <= "\udfff" for c in text):
        try:  # Java's strings are UTF-16: \uD83D\uDE00 is one character
            text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
        except UnicodeDecodeError:
            raise _Malformed("\\uXXXX escape (half of a surrogate pair)") from None
    return text


def _ends_blank(raw: str) -> bool:
    """``raw`` ends in white space no backslash escapes."""
    if not raw or raw[-1] not in _BLANK:
        return False
    body = raw[:-1]
    return (len(body) - len(body.rstrip("\\"))) % 2 == 0


# --- sparkpoint's reading of them ----------------------------------------------------------------


def plain_properties(
    text: str, source: str, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Java properties (`java_properties`) with ``${env:NAME}`` in values replaced by the
    variable of ``environ`` (the process's by default; a missing one is an error naming it and
    the line), and no Kafka rule: a ``--sasl-users`` file's ``name=password`` lines."""
    return {key: found.value for key, found in _expanded(text, source, environ).items()}


def parse_properties(
    text: str, source: str, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A Kafka client configuration: `plain_properties`, then Java's ``sasl.jaas.config`` read
    as ``sasl.username`` and ``sasl.password``, ``ssl.keystore.type=PKCS12`` dropped, and Java's
    truststore, a Java keystore and the keys sparkpoint owns refused, each error naming the file,
    the line and the key. A secret's value ending in white space the file did not escape is kept,
    as Java's Properties.load keeps it, with a warning naming the key."""
    expanded = _expanded(text, source, environ)
    for key, found in expanded.items():
        if found.alone and "." not in key:
            # a word alone on a line (a password pasted on a line of its own?): librdkafka would
            # quote it back as an unknown property, so it is refused without being named
            raise KafkaConfigError(
                f"{source}:{found.line}: a word with no value and no dot, which no Kafka client "
                "property is (a value pasted on a line of its own?)"
            )
        if found.blank_end and is_secret(key):
            log.warning(
                "%s:%d: the value of %s ends in white space, which is kept as part of it "
                "(Properties.load keeps it; Kafka's Java clients trim it afterwards): remove it "
                "unless the secret ends so",
                source,
                found.line,
                key,
            )
    properties = {key: found.value for key, found in expanded.items()}
    return _translated(properties, source, {key: found.line for key, found in expanded.items()})


def _expanded(text: str, source: str, environ: Mapping[str, str] | None) -> dict[str, Property]:
    """Each key's property (a later line wins), ``${env:NAME}`` replaced in its value."""
    variables = os.environ if environ is None else environ
    return {
        found.key: replace(found, value=_expand(found, variables, source))
        for found in java_properties(text, source)
    }


def _expand(found: Property, variables: Mapping[str, str], source: str) -> str:
    def variable(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in variables:
            raise KafkaConfigError(
                f"{source}:{found.line}: the environment variable {name} (for {found.key}) is "
                "not set"
            )
        return variables[name]

    return _ENV.sub(variable, found.value)


def _translated(
    properties: dict[str, str], source: str, lines: Mapping[str, int]
) -> dict[str, str]:
    def at(key: str) -> str:
        return f"{source}:{lines[key]}: {key}"

    for key, why in SPARKPOINT_OWNS.items():
        if key in properties:
            raise KafkaConfigError(f"{at(key)} is sparkpoint's to set, not the file's: {why}")
    for key, instead in JAVA_ONLY.items():
        if key in properties:
            raise KafkaConfigError(f"{at(key)} is Java's; librdkafka takes {instead}")
    _check_keystore(properties, at)
    jaas = properties.pop("sasl.jaas.config", None)
    if jaas is not None:
        try:
            credentials = jaas_credentials(jaas)
        except ValueError as exc:
            raise KafkaConfigError(f"{at('sasl.jaas.config')}: {exc}") from None
        for option, key in (("username", "sasl.username"), ("password", "sasl.password")):
            if option not in credentials:
                continue
            if properties.setdefault(key, credentials[option]) != credentials[option]:
                raise KafkaConfigError(
                    f"{at('sasl.jaas.config')}: its {option} is not the {key} of line "
                    f"{lines[key]}; give one of them"
                )
    return properties


def _check_keystore(properties: dict[str, str], at: Callable[[str], str]) -> None:
    """librdkafka's keystore is PKCS#12: ``ssl.keystore.type=PKCS12`` says nothing more and is
    dropped (librdkafka has no such key); a Java keystore, by its type or a ``.jks`` name, is
    refused. Kafka trims and Java's KeyStore ignores case, so both are done here too."""
    kind = properties.pop("ssl.keystore.type", None)
    if kind is not None:
        kind = kind.strip().upper()
        if kind in ("JKS", "JCEKS"):
            raise KafkaConfigError(
                f"{at('ssl.keystore.type')} names a Java keystore, which librdkafka cannot "
                f"read: {KEYSTORE_CONVERSION}"
            )
        if kind == "PEM":
            raise KafkaConfigError(
                f"{at('ssl.keystore.type')}: librdkafka takes a PEM certificate and key as "
                "ssl.certificate.location and ssl.key.location (or ssl.certificate.pem and "
                "ssl.key.pem), not as a keystore"
            )
        if kind != "PKCS12":
            raise KafkaConfigError(
                f"{at('ssl.keystore.type')}: librdkafka's keystore (ssl.keystore.location) "
                "is PKCS#12 only; give PKCS12 or leave the key out"
            )
    location = properties.get("ssl.keystore.location")
    if location is not None and location.strip().lower().endswith(".jks"):
        raise KafkaConfigError(
            f"{at('ssl.keystore.location')} names a Java keystore (.jks), which librdkafka "
            f"cannot read: {KEYSTORE_CONVERSION} (a file already PKCS#12: name it .p12)"
        )


# --- Java's JAAS line ----------------------------------------------------------------------------

JAAS_MODULES = (
    "org.apache.kafka.common.security.plain.PlainLoginModule",
    "org.apache.kafka.common.security.scram.ScramLoginModule",
)
"""The login modules whose options are librdkafka's ``sasl.username`` and ``sasl.password``."""

_JAAS_FLAGS = ("REQUIRED", "REQUISITE", "SUFFICIENT", "OPTIONAL")
_STREAM_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}

_Token = tuple[str, str | None]
"""(kind, text): ("word", w), ("quoted", unescaped text), ("number", None), (a character, None)
or ("eof", None), as java.io.StreamTokenizer's ttype and sval."""


def jaas_credentials(jaas: str) -> dict[str, str]:
    """The options (``username``, ``password``...) of a PLAIN or SCRAM ``sasl.jaas.config``, read
    as Kafka's JaasConfig reads it: one ``Module flag name=value ... ;`` entry, a value a word or
    quoted (``"..."`` or ``'...'``, with StreamTokenizer's escapes: ``\\"`` is ``"``, ``\\\\`` is
    ``\\``, ``\\n``, octal...), ``//`` and ``/* */`` comments. A ValueError says what is wrong,
    never quoting the text."""
    tokens = _jaas_tokens(jaas)

    def take() -> _Token:
        return next(tokens, ("eof", None))

    entries: list[tuple[str | None, dict[str, str]]] = []
    while (token := take())[0] != "eof":
        module = token[1]
        flag = take()
        if (flag[1] or "").upper() not in _JAAS_FLAGS:
            raise ValueError(
                "the login module is not followed by required, requisite, sufficient or optional"
            )
        options: dict[str, str] = {}
        count = 0
        while (token := take())[0] not in ("eof", ";"):
            count += 1
            name = token[1]
            if take()[0] != "=":
                raise ValueError(f"option {count} is not name=value")
            value = take()[1]
            if value is None:
                raise ValueError(
                    f'option {count} has no value Kafka can read (quote it: name="...")'
                )
            if name is not None:
                options[name] = value
        if token[0] != ";":
            raise ValueError("the login module's entry does not end with ';'")
        entries.append((module, options))
    if len(entries) != 1:
        raise ValueError(f"a client takes one login module, not {len(entries)}")
    module, options = entries[0]
    if module not in JAAS_MODULES:
        raise ValueError(
            "only the PLAIN and SCRAM login modules can be read; give sasl.username and "
            "sasl.password instead"
        )
    return options


def _jaas_tokens(text: str) -> Iterator[_Token]:
    """java.io.StreamTokenizer's tokens as Kafka's JaasConfig sets it up: white space is every
    character up to the space; ``/`` starts a comment (``/* */``, else to the end of the line);
    ``"`` and ``'`` quote; a number starts with a digit, ``.`` or ``-``; a word starts with a
    letter, ``_``, ``$`` or a character from U+00A0 and goes on with those, digits, ``.`` and
    ``-``; anything else is a token of its own."""
    at, end = 0, len(text)
    while at < end:
        char = text[at]
        if char <= " ":
            at += 1
        elif char == "/":
            if text.startswith("/*", at):
                close = text.find("*/", at + 2)
                at = end if close < 0 else close + 2
            else:  # StreamTokenizer reads the character after "/" before it looks for the end
                at = _line_end(text, at + 2)
        elif char in "\"'":
            value, at = _quoted(text, at)
            yield "quoted", value
        elif char in "0123456789.-":
            start = at
            at += 1 if char == "-" else 0
            if start != at and (at == end or text[at] not in "0123456789."):
                yield "-", None
                continue
            dot = False
            while at < end and text[at] in "0123456789.":
                if text[at] == ".":
                    if dot:
                        break
                    dot = True
                at += 1
            yield "number", None
        elif _word_start(char):
            start = at
            while at < end and (_word_start(text[at]) or text[at] in "0123456789.-"):
                at += 1
            yield "word", text[start:at]
        else:
            at += 1
            yield char, None


def _word_start(char: str) -> bool:
    return (char.isascii() and char.isalpha()) or char in "_$" or char >= "\u00a0"


def _line_end(text: str, at: int) -> int:
    ends = [i for i in (text.find("\n", at), text.find("\r", at)) if i >= 0]
    return min(ends, default=len(text))


def _quoted(text: str, at: int) -> tuple[str, int]:
    """The string quoted at ``text[at]`` and where the text goes on: it ends at the same quote,
    a line end or the end of the text."""
    quote, end = text[at], len(text)
    out: list[str] = []
    at += 1
    while at < end and text[at] not in (quote, "\n", "\r"):
        char = text[at]
        at += 1
        if char != "\\" or at == end:
            out.append(char)
            continue
        char = text[at]
        at += 1
        if "0" <= char <= "7":  # up to three octal digits, \377 at most
            code = int(char)
            for _ in range(2 if char <= "3" else 1):
                if at < end and "0" <= text[at] <= "7":
                    code = code * 8 + int(text[at])
                    at += 1
                else:
                    break
            out.append(chr(code))
        else:
            out.append(_STREAM_ESCAPES.get(char, char))
    if at < end and text[at] == quote:
        at += 1
    return "".join(out), at


# --- the process's configuration -----------------------------------------------------------------


def load_properties(path: Path | str) -> dict[str, str]:
    """The properties of ``path`` (UTF-8, a byte order mark ignored); its secrets are registered
    for redaction."""
    where = Path(path)
    try:
        data = where.read_bytes()
    except OSError as exc:
        raise KafkaConfigError(
            f"cannot read the Kafka client configuration {where}: {exc}"
        ) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise KafkaConfigError(
            f"{where}:{line}: not UTF-8 text; write other characters as \\uXXXX"
        ) from None
    properties = parse_properties(text, str(where))
    secrets = secrets_of(properties)
    # a secret with stray white space is registered bare too: a message may quote it trimmed
    register_secrets([*secrets, *(s.strip() for s in secrets)])
    return properties


SCHEMA_REGISTRY_PREFIX = "schema.registry."
"""Keys under this prefix are the Schema Registry client's (Confluent's serializers read them
from the same file): ``schema.registry.basic.auth.user.info``, ``schema.registry.ssl.ca.location``,
``schema.registry.bearer.auth.token``... librdkafka never sees them."""

Frozen = tuple[tuple[str, str], ...]
"""Properties as a Spark task carries them: hashable, in a stable order."""


def frozen(*layers: Mapping[str, object]) -> Frozen:
    """``layers`` merged, later over earlier, as strings."""
    merged: dict[str, str] = {}
    for layer in layers:
        merged |= {str(k): str(v) for k, v in layer.items()}
    return tuple(sorted(merged.items()))


_loaded: dict[str, dict[str, str]] = {}
_lock = threading.Lock()


def _process_properties() -> dict[str, str]:
    path = os.environ.get(CONFIG_ENV)
    if not path:
        return {}
    with _lock:
        if path not in _loaded:
            _loaded[path] = load_properties(path)
        return _loaded[path]


def client_properties() -> dict[str, str]:
    """This process's librdkafka properties: the file ``SPARKPOINT_KAFKA_CONFIG`` names (read
    once), without the Schema Registry's; none without a file."""
    return {
        k: v for k, v in _process_properties().items() if not k.startswith(SCHEMA_REGISTRY_PREFIX)
    }


def schema_registry_properties() -> dict[str, str]:
    """This process's Schema Registry client settings (the file's ``schema.registry.*`` keys,
    prefix removed; ``url`` is the value format's own)."""
    return {
        k[len(SCHEMA_REGISTRY_PREFIX) :]: v
        for k, v in _process_properties().items()
        if k.startswith(SCHEMA_REGISTRY_PREFIX) and k != f"{SCHEMA_REGISTRY_PREFIX}url"
    }


def use_properties_file(path: Path) -> dict[str, str]:
    """Makes ``path`` this process's Kafka client configuration and that of the processes it
    starts (through ``SPARKPOINT_KAFKA_CONFIG``); reads it at once so a bad file fails here."""
    absolute = str(path.resolve())
    properties = load_properties(absolute)
    with _lock:
        _loaded[absolute] = properties
    os.environ[CONFIG_ENV] = absolute
    return dict(properties)
