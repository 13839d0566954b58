"""Paths and URLs as strings: one spelling for comparing them, and whether one lies inside
another. Pure string work (no file system, no fsspec), so the coordinator's pure core can check
the paths that came in events; `sparkpoint.common.storage` does the file operations."""

from __future__ import annotations

import os
import posixpath


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


def _plain(path: str) -> bool:
    return path.startswith("/") and "/." not in path and "//" not in path and not path.endswith("/")


def within(path: str, directory: str) -> bool:
    """Whether ``path`` lies strictly inside ``directory`` (both compared in `canonical` form)."""
    inner, outer = canonical(path), canonical(directory)
    return inner.startswith(outer.rstrip("/") + "/")
