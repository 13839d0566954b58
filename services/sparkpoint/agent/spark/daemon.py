"""PySpark's daemon for local masters (``spark.python.daemon.module``, `MODULE`), importing
pyspark and py4j from their installed packages rather than from the source zips beside them.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on every Python worker's
path. Python compiles what it imports from a zip of sources each time and keeps nothing: the
daemon spent 0.5-0.6 s compiling pyspark before it forked its first worker, and each worker
more for what it imports after the fork (pyspark.worker, pyspark.sql), so a session's first
Spark job took 1.1-1.2 s from the context to its results, 0.5-0.55 s with the installed
packages (measured here, a 2-task job on ``local[2]``). With pip's pyspark ``SPARK_HOME`` is
the installed package, and the zip holds the same sources, compiled once at install: the zips
move after the rest of the path when the package they came with is there (`installed_first`).
Any other layout (a Spark distribution, a py4j of another version) keeps Spark's order.

This module imports nothing of pyspark before it reorders the path; ``import sparkpoint`` is
cheap (its names load when first used).

A worker whose JVM went away ends without a word (`quietly_when_the_driver_is_gone`): PySpark's
daemon prints a worker's exception before the worker exits, and when the driver's JVM ends under
a worker still answering it (an agent that could not start exits while its Python workers warm
up), that was a broken pipe's traceback after the agent's one-line error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

MODULE = "sparkpoint.agent.spark.daemon"

SETTING = "spark.python.daemon.module"


def installed_first(path: list[str]) -> list[str]:
    """``path`` with the zips an installed pyspark ships moved to its end, when their packages
    are importable from ``path`` as they are (the same sources, compiled)."""
    shipped = [entry for entry in path if _shipped_with_its_package(entry, path)]
    return [entry for entry in path if entry not in shipped] + shipped


def _shipped_with_its_package(entry: str, path: list[str]) -> bool:
    """``entry`` is ``<site>/pyspark/python/lib/pyspark.zip`` (or py4j's zip of the version
    installed in ``<site>``), with ``<site>`` on ``path`` and pyspark installed there."""
    lib = os.path.dirname(entry)
    package = os.path.dirname(os.path.dirname(lib))
    site = os.path.dirname(package)
    if not (
        lib == os.path.join(package, "python", "lib")
        and os.path.basename(package) == "pyspark"
        and site in path
        and os.path.isfile(os.path.join(package, "__init__.py"))
    ):
        return False
    name = os.path.basename(entry)
    if name == "pyspark.zip":
        return True
    if name.startswith("py4j-") and name.endswith("-src.zip"):
        version = name[len("py4j-") : -len("-src.zip")]
        return os.path.isdir(os.path.join(site, f"py4j-{version}.dist-info"))
    return False


def quietly_when_the_driver_is_gone(worker: Callable[..., int]) -> Callable[..., int]:
    """``worker`` (PySpark's daemon runs one task with it in a forked process), ending that
    process with the code PySpark's daemon gives a failed worker, but without printing the
    traceback, when its socket to the JVM is closed: the JVM ended (or gave up on the worker),
    nobody reads what the worker would say, and the agent said why it stopped."""

    def run(*args: Any) -> int:
        try:
            return worker(*args)
        except (BrokenPipeError, ConnectionResetError):
            sys.stderr.flush()
            os._exit(1)

    return run


if __name__ == "__main__":
    sys.path[:] = installed_first(sys.path)
    import pyspark.daemon

    pyspark.daemon.worker = quietly_when_the_driver_is_gone(pyspark.daemon.worker)
    pyspark.daemon.manager()
