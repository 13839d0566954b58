"""Java's two text formats a Kafka client file holds, read exactly as Java reads them: a
properties file (`java_properties`: java.util.Properties.load's rules) and a JAAS line
(`jaas_credentials`: Kafka's JaasConfig over java.io.StreamTokenizer). Pure; errors name the
file, the line and the key, never a value."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass


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
