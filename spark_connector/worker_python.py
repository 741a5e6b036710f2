"""Which Python Spark starts its Python workers with, and what a worker that cannot run
the connector says.

Spark starts them with `PYSPARK_PYTHON`, or `python3` from PATH when it is unset: often
not the Python the driver runs in (a venv's), and one without pyarrow. Spark reads the
variable when the driver launches its JVM: the JVM inherits it (and runs with it the
lookup of `pyspark_*` modules and the sources found there), and SparkContext takes it as
`pythonExec` (for registered sources and UDFs). `spark.pyspark.python` reaches neither
from a plain `python script.py`; spark-submit hands it to the driver's Python as
PYSPARK_PYTHON.

It imports only the standard library: it runs while the rest of the package may not import.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Set by Spark (4.x) in the environment of every Python worker it starts.
IN_WORKER = "SPARK_PYTHON_RUNTIME"
# A module of these missing is a bug of ours, not an interpreter to change.
OWN_PACKAGES = frozenset({"spark_connector", "client", "protocol"})


def default_workers_to_this_python() -> None:
    """Set PYSPARK_PYTHON to this interpreter, which has the connector, when nothing else
    chose the workers' Python and this process has yet to launch Spark's JVM.

    Not in a driver handed its JVM (spark-submit's: PYSPARK_GATEWAY_PORT), nor once this
    process has launched one: the JVM would keep `python3` while SparkContext took this
    interpreter."""
    if not sys.executable or any(
        name in os.environ for name in ("PYSPARK_PYTHON", "PYSPARK_GATEWAY_PORT", IN_WORKER)
    ):
        return
    from pyspark import SparkContext

    if SparkContext._gateway is None:
        os.environ["PYSPARK_PYTHON"] = sys.executable


@contextmanager
def explain_missing_dependency() -> Iterator[None]:
    """In a Spark worker, turn a missing dependency into an error naming this interpreter,
    why Spark runs it, and how to choose another: Spark shows the bare traceback."""
    try:
        yield
    except ModuleNotFoundError as error:
        missing = error.name
        if missing is None or missing.partition(".")[0] in OWN_PACKAGES:
            raise
        if IN_WORKER not in os.environ:
            raise
        raise ModuleNotFoundError(_worker_lacks(missing), name=missing) from error


def _worker_lacks(module: str) -> str:
    chosen = os.environ.get("PYSPARK_PYTHON")
    why = f"PYSPARK_PYTHON={chosen}" if chosen else "`python3` from PATH: PYSPARK_PYTHON is unset"
    spark_python = _spark_python()
    export = (
        f"`export PYSPARK_PYTHON={spark_python}` (the Python that pyspark is installed in), or "
        if spark_python
        else ""
    )
    return (
        f"No module named {module!r} in {sys.executable}, the Python that Spark runs its "
        f"Python workers with ({why}). Set PYSPARK_PYTHON to a Python that has minibroker "
        f"and pyarrow installed, before the SparkSession starts: {export}"
        '`os.environ["PYSPARK_PYTHON"] = sys.executable` at the top of the script, as '
        "importing spark_connector before the session does."
    )


def _spark_python() -> Path | None:
    """The interpreter whose site-packages hold the running Spark, when pip installed it:
    the driver's, most likely."""
    home = os.environ.get("SPARK_HOME")
    if not home:
        return None
    site = Path(home).parent
    if site.name not in ("site-packages", "dist-packages") or site.parents[1].name != "lib":
        return None
    for name in ("python", "python3"):
        candidate = site.parents[2] / "bin" / name
        if candidate.exists() and candidate != Path(sys.executable):
            return candidate
    return None
