"""The version of pairlink, read from the installed distribution (pyproject.toml is its one
source); a checkout on ``sys.path`` that is not installed says ``0+unknown``."""

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "pairlink-amqp"
"""The name on the package index (``pairlink`` there is another project's)."""

try:
    VERSION = version(DISTRIBUTION)
except PackageNotFoundError:
    VERSION = "0+unknown"
