"""The minibroker broker. `__version__` is the installed distribution's version.

Read from the package metadata so that pyproject.toml stays the one place a
release number is written; a source tree that was never installed says "unknown".
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("minibroker")
except PackageNotFoundError:
    __version__ = "unknown"
