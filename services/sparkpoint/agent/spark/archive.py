"""Where the Spark driver's class archive is and how a session maps it (class_archive.py builds
it): ``SPARKPOINT_SPARK_CLASS_ARCHIVE`` names the file, or ``off``; by default it lies beside the
environment that holds pyspark."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

ARCHIVE_ENV = "SPARKPOINT_SPARK_CLASS_ARCHIVE"
"""The archive's path, ``off`` for none; unset: ``DEFAULT_ARCHIVE``."""

DEFAULT_ARCHIVE = Path(sys.prefix) / "share" / "sparkpoint" / "spark-driver.jsa"
"""Beside the environment that holds pyspark: its jars are the class path the archive matches."""

DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


def archive_path(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Where the archive is, or None when it is turned off."""
    configured = environ.get(ARCHIVE_ENV)
    if configured is None:
        return DEFAULT_ARCHIVE
    if configured.strip().lower() in ("", "off"):
        return None
    return Path(configured).expanduser()


def with_archive(settings: Mapping[str, str], archive: Path | None) -> dict[str, str]:
    """``settings`` with the driver's Java options mapping ``archive``, when it is a file; the
    caller's own driver Java options come first and stay."""
    chosen = dict(settings)
    if archive is None or not archive.is_file():
        return chosen
    own = chosen.get(DRIVER_JAVA_OPTIONS, "").strip()
    chosen[DRIVER_JAVA_OPTIONS] = f"{own} -XX:SharedArchiveFile={archive}".strip()
    return chosen
