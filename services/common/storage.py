"""Checkpoint storage through fsspec: atomic writes, deletes, and confinement to the configured
roots (a request can name a savepoint directory; it can never make the coordinator write or
delete outside the checkpoint and savepoint roots).
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import uuid
from collections.abc import Iterable
from pathlib import Path

import fsspec
from fsspec.core import url_to_fs

log = logging.getLogger(__name__)

CHECKPOINT_DIR = re.compile(r"^chk-(\d+)$")
"""A checkpoint's directory under ``<checkpoint-dir>/<job-id>/``: ``chk-<id>``."""


class PathOutsideRoots(ValueError):
    """A path does not lie under any configured storage root."""


def _split(url: str) -> tuple[str, str]:
    """(protocol, normalised absolute path) of a URL or local path."""
    if "://" in url:
        protocol, rest = url.split("://", 1)
        return protocol, posixpath.normpath("/" + rest.lstrip("/"))
    return "file", str(Path(url).expanduser().resolve())


def canonical(url: str) -> str:
    """A path or URL in one spelling: absolute, no ``.``/``..`` segments, no doubled or trailing
    slashes. Pure string work (no file system calls), for comparing and prefix-testing paths that
    came from events. Local paths resolve against the working directory."""
    if "://" in url:
        protocol, rest = url.split("://", 1)
        if _plain("/" + rest):
            return url
        return f"{protocol}://{posixpath.normpath('/' + rest.lstrip('/')).lstrip('/')}"
    if _plain(url):
        return url  # the common case, already canonical: no work on the acknowledgement path
    return os.path.normpath(os.path.abspath(os.path.expanduser(url)))


def absolute(url: str) -> str:
    """A URL as given, a local path made absolute (relative paths mean the working directory of
    the process that reads them; resolved once, at start, and shown)."""
    return url if "://" in url else str(Path(url).expanduser().resolve())


def _plain(path: str) -> bool:
    return path.startswith("/") and "/." not in path and "//" not in path and not path.endswith("/")


def within(path: str, directory: str) -> bool:
    """Whether ``path`` lies strictly inside ``directory`` (both compared in `canonical` form)."""
    inner, outer = canonical(path), canonical(directory)
    return inner.startswith(outer.rstrip("/") + "/")


class Storage:
    """File operations confined to ``roots`` (fsspec URLs or local paths)."""

    def __init__(self, roots: Iterable[str]) -> None:
        self.roots = [_split(root) for root in roots]
        if not self.roots:
            raise ValueError("storage needs at least one root")

    def check(self, path: str) -> str:
        """Returns ``path`` if it lies under a root; raises `PathOutsideRoots` otherwise."""
        protocol, normalised = _split(path)
        for root_protocol, root in self.roots:
            if protocol == root_protocol and (
                normalised == root or normalised.startswith(root.rstrip("/") + "/")
            ):
                return path
        raise PathOutsideRoots(f"{path} is outside the storage roots")

    def write_atomic(self, path: str, data: bytes) -> None:
        """Writes ``data`` so that readers see all of it or nothing: a temporary file in the same
        directory, renamed into place (object stores make a single put atomic anyway)."""
        self.check(path)
        fs, target = url_to_fs(path)
        directory = posixpath.dirname(target)
        fs.makedirs(directory, exist_ok=True)
        temporary = posixpath.join(
            directory, f".{posixpath.basename(target)}.{uuid.uuid4().hex}.tmp"
        )
        with fs.open(temporary, "wb") as out:
            out.write(data)
        try:
            fs.mv(temporary, target)
        except Exception:
            fs.rm(temporary)
            raise

    def read(self, path: str) -> bytes:
        self.check(path)
        with fsspec.open(path, "rb") as source:
            data: bytes = source.read()
        return data

    def exists(self, path: str) -> bool:
        self.check(path)
        fs, target = url_to_fs(path)
        return bool(fs.exists(target))

    def delete(self, files: Iterable[str], directory: str | None = None) -> int:
        """Deletes files, then the directory (recursively) if given; returns how many paths went.
        Missing files are fine: a discard may be retried."""
        removed = 0
        for path in [*files, *([directory] if directory else [])]:
            self.check(path)
            fs, target = url_to_fs(path)
            try:
                if fs.exists(target):
                    fs.rm(target, recursive=fs.isdir(target))
                    removed += 1
            except FileNotFoundError:
                pass
        return removed

    def list_dirs(self, path: str) -> list[str]:
        """Sub-directories of ``path`` (for listing savepoints)."""
        self.check(path)
        fs, target = url_to_fs(path)
        if not fs.exists(target):
            return []
        protocol = _split(path)[0]
        prefix = "" if protocol == "file" else f"{protocol}://"
        return sorted(
            prefix + entry["name"]
            for entry in fs.ls(target, detail=True)
            if entry["type"] == "directory"
        )
