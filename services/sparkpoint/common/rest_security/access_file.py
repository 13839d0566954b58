"""The access list's file, which the operator manages: read at start (a file that cannot be used
stops the service with a message naming it), and read again whenever it changes, so a token is
granted or revoked without a restart.

A change is seen at the next request (the file's modification time, size and inode are compared
on each one: a ``stat``, a few microseconds). A file that no longer parses, lists neither tokens
nor certificates (emptied, comments only, or caught half-written by an editor that rewrites it
in place), or is gone, refuses every request (503) and says why in the log, once per version of
the file, until it is fixed: an edit that breaks the file never leaves a revoked token working,
nor lets every certificate of the client CA operate. Writing a new file and renaming it over
the old one is never seen half-written.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparkpoint.common.redaction import register_secrets
from sparkpoint.common.rest_security.access import AccessList, AccessListError, parse_access_list

log = logging.getLogger(__name__)


def read_access_list(path: Path) -> AccessList:
    """The access list in ``path`` (YAML, or JSON), its clear tokens registered as secrets."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AccessListError(f"{path}: no such file (the REST access list)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AccessListError(f"{path}: cannot be read ({exc})") from None
    access = parse_access_list(_parse(text, path), str(path))
    register_secrets(access.clear_tokens)
    return access


def _parse(text: str, path: Path) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        import yaml
    except ImportError:  # PyYAML is not among sparkpoint's own dependencies
        raise AccessListError(
            f"{path}: not valid JSON, and YAML needs PyYAML (pip install pyyaml)"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AccessListError(f"{path}: not valid YAML or JSON ({_one_line(exc)})") from None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


Signature = tuple[int, int, int]


def _signature(path: Path) -> Signature | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size, stat.st_ino)


class AccessFile:
    """The access list of ``path``, as it is now (`current`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._signature = _signature(path)
        self._access: AccessList | None = read_access_list(path)

    def current(self) -> AccessList | None:
        """The access list; None while the file cannot be used (logged once per version)."""
        signature = _signature(self.path)
        if signature == self._signature:
            return self._access
        self._signature = signature
        try:
            self._access = read_access_list(self.path)
        except AccessListError as exc:
            self._access = None
            log.error("REST access list: %s; every request is refused until it is fixed", exc)
        else:
            log.info(
                "REST access list %s read again: %d tokens, %d certificates",
                self.path, len(self._access.tokens), len(self._access.certificates),
            )  # fmt: skip
        return self._access


def access_source(path: Path | None) -> Callable[[], AccessList | None]:
    """The access list as it is now: ``path``'s (read now, so a file that cannot be used raises
    `AccessListError`; then read again when it changes), or without a file an empty one, which
    admits client certificates by their default role."""
    if path is not None:
        return AccessFile(path).current
    certificates_only = AccessList()
    return lambda: certificates_only
