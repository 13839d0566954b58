"""Keyed state on local disk when its files live elsewhere (an object store): Flink's local state
(``execution.checkpointing.local-backup.*``) and local recovery
(``execution.state-recovery.from-local``).

Each file a task reads from, or writes to, the object store is also kept in the job's local
directory on the machine that ran the task (``<root>/<job id>/``, the root from
``execution.checkpointing.local-backup.dirs``, default the system's temporary directory), named by
a hash of its URL: files are written once and never changed, so a local copy stays right for
as long as it exists. Later rounds memory-map it: the state lies on local disk with the page
cache and the worker's budget as its caches, and an object store is read once per file and
machine, not once per round.

With ``local-backup.enabled``, a checkpoint's copies of working files are local too (a hard link
to the working file's local copy, under the copy's URL), so a restart on the same machine
restores from local disk; with ``from-local`` off, a restart empties the directory first and
reads everything from the checkpoint. Other machines find nothing and read from the store."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable

log = logging.getLogger(__name__)

DEFAULT_ROOT = os.path.join(tempfile.gettempdir(), "sparkpoint-local-state")


def job_local_dir(configured: str | None, job_id: str) -> str:
    """The job's local directory: under the first of the configured roots (Flink takes a list,
    comma-separated, and spreads over them; one is used here), else under `DEFAULT_ROOT`."""
    roots = [r.strip() for r in (configured or "").split(",") if r.strip()]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", job_id)
    return os.path.join(roots[0] if roots else DEFAULT_ROOT, safe)


def cached(local_dir: str, url: str) -> str:
    """Where the local copy of ``url`` is, whether or not it exists."""
    digest = hashlib.sha1(url.encode()).hexdigest()
    return os.path.join(local_dir, digest[:2], f"{digest}.arrow")


def link(local_dir: str, source: str, target: str) -> bool:
    """``target`` (a checkpoint's copy of ``source``) kept locally as a hard link to the local
    copy of ``source``; false when there is none on this machine."""
    origin, alias = cached(local_dir, source), cached(local_dir, target)
    for _ in range(2):
        try:
            os.link(origin, alias)
            return True
        except FileExistsError:
            return True
        except FileNotFoundError:
            if not os.path.exists(origin):
                return False
            os.makedirs(os.path.dirname(alias), exist_ok=True)
        except OSError as exc:  # links not supported here: no local copy
            log.debug("no local copy of %s: %s", target, exc)
            return False
    return False


def forget(local_dir: str, urls: Iterable[str]) -> None:
    """The local copies of ``urls`` removed (the files are deleted, or no longer needed)."""
    for url in urls:
        with contextlib.suppress(OSError):
            os.unlink(cached(local_dir, url))


def keep_only(local_dir: str, urls: Iterable[str]) -> int:
    """Every local copy but those of ``urls`` removed (a restore keeps what it restores);
    returns how many are kept."""
    wanted = {cached(local_dir, url) for url in urls}
    kept = 0
    for directory, _, names in os.walk(local_dir):
        for name in names:
            path = os.path.join(directory, name)
            if path in wanted:
                kept += 1
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
    return kept


def clear(local_dir: str) -> None:
    shutil.rmtree(local_dir, ignore_errors=True)
