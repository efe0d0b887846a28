"""Primus core: config, patches, backend discovery and the runtime. Imports no framework."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("primus-core")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0+unknown"
