"""Which Python Spark's workers run: the connector points them at the driver's interpreter
when it can, and otherwise fails naming the workers' interpreter and the fix, not with a
bare DATA_SOURCE_NOT_FOUND."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_connector.worker_python import (
    default_workers_to_this_python,
    explain_missing_dependency,
)

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
# What chooses the workers' Python, and the markers of a process that must not choose it.
CHOOSERS = (
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "PYSPARK_GATEWAY_PORT",
    "SPARK_PYTHON_RUNTIME",
)


def unchosen_env(**extra: str) -> dict[str, str]:
    """This environment without anything that picks the workers' Python, as a user's shell."""
    return {**{k: v for k, v in os.environ.items() if k not in CHOOSERS}, **extra}


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `python3` without pyarrow, as the system's often is: a venv with nothing in it."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python3"
    probe = subprocess.run([python, "-c", "import pyarrow"], capture_output=True, timeout=60)
    assert probe.returncode != 0, "the bare venv must lack pyarrow"
    return python


# Run as `python -c` in a fresh process, which has launched no JVM.
_IMPORT_THEN_ASK = """
import json, os
import spark_connector
from spark_connector.worker_python import (
    default_workers_to_this_python,
    explain_missing_dependency,
)

seen = {"import": os.environ.pop("PYSPARK_PYTHON", None)}
for marker in ("PYSPARK_GATEWAY_PORT", "SPARK_PYTHON_RUNTIME"):
    os.environ[marker] = "1"
    default_workers_to_this_python()
    seen[marker] = os.environ.pop("PYSPARK_PYTHON", None)
    del os.environ[marker]
os.environ["PYSPARK_PYTHON"] = "/opt/chosen/python"
default_workers_to_this_python()
seen["chosen"] = os.environ["PYSPARK_PYTHON"]
print(json.dumps(seen))
"""


def test_importing_the_connector_before_spark_points_workers_at_this_python() -> None:
    """Set only when nothing chose: not over the user's PYSPARK_PYTHON, not in a driver
    handed its JVM (spark-submit), not in a Spark worker."""
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_THEN_ASK],
        cwd=ROOT,
        env=unchosen_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "import": sys.executable,
        "PYSPARK_GATEWAY_PORT": None,
        "SPARK_PYTHON_RUNTIME": None,
        "chosen": "/opt/chosen/python",
    }


def test_no_default_once_this_process_launched_spark(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The JVM keeps the environment it started with; a later PYSPARK_PYTHON would reach
    SparkContext's registered sources but not the JVM's discovered ones."""
    monkeypatch.delenv("PYSPARK_PYTHON")
    default_workers_to_this_python()
    assert "PYSPARK_PYTHON" not in os.environ


def test_only_another_projects_module_missing_in_a_worker_is_explained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A module of ours missing is a bug, shown as it is; so is any outside a worker."""
    monkeypatch.setenv("SPARK_PYTHON_RUNTIME", "PYTHON_WORKER")
    with pytest.raises(ModuleNotFoundError) as ours, explain_missing_dependency():
        importlib.import_module("client.no_such_module")
    assert str(ours.value) == "No module named 'client.no_such_module'"
    with pytest.raises(ModuleNotFoundError) as theirs, explain_missing_dependency():
        importlib.import_module("no_such_project")
    assert str(theirs.value).startswith(f"No module named 'no_such_project' in {sys.executable},")
    assert theirs.value.name == "no_such_project"
    monkeypatch.delenv("SPARK_PYTHON_RUNTIME")
    with pytest.raises(ModuleNotFoundError) as driver, explain_missing_dependency():
        importlib.import_module("no_such_project")
    assert str(driver.value) == "No module named 'no_such_project'"


# The user's script: no import of ours, nothing set; read and write fail, and say why.
_USE_THE_FORMAT = """
import json
from pyspark.sql import SparkSession

spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
options = {"minibroker.bootstrap.servers": "127.0.0.1:9", "topic": "t"}
failures = []
try:
    spark.read.format("minibroker").options(**options).load()
except Exception as exc:
    failures.append(str(exc))
try:
    df = spark.createDataFrame([("v",)], "value string")
    df.write.format("minibroker").mode("append").options(**options).save()
except Exception as exc:
    failures.append(str(exc))
spark.stop()
print(json.dumps(failures))
"""


def test_workers_python_without_pyarrow_names_itself_and_the_fix(
    bare_python: Path, tmp_path: Path
) -> None:
    """A fresh Spark process (about 15 s), since the JVM takes the workers' Python from
    the environment it starts with. `python3` on PATH lacks pyarrow and the script runs
    from the checkout, whose `pyspark_minibroker` the workers find in their working dir."""
    out = subprocess.run(
        [sys.executable, "-c", _USE_THE_FORMAT],
        cwd=ROOT,
        env=unchosen_env(
            PATH=f"{bare_python.parent}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(ROOT)
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    read, write = json.loads(out.stdout.splitlines()[-1])
    for failure in (read, write):
        assert "DATA_SOURCE_NOT_FOUND" not in failure
        assert f"No module named 'pyarrow' in {bare_python}," in failure, failure
        assert "(`python3` from PATH: PYSPARK_PYTHON is unset)" in failure
        # The Python whose site-packages hold pyspark: this venv's.
        chosen = re.search(r"`export PYSPARK_PYTHON=(\S+)`", failure)
        assert chosen is not None, failure
        assert Path(chosen[1]).parent == Path(sys.executable).parent
        assert '`os.environ["PYSPARK_PYTHON"] = sys.executable`' in failure
