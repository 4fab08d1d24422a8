"""ember's version: the installed distribution's, else pyproject.toml's (a source checkout run
with PYTHONPATH), and the `--version` text every ember command prints."""
from __future__ import annotations

import pathlib
import re
from importlib import metadata


def _version() -> str:
    pyproject = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"
    if pyproject.is_file():   # a checkout: its own version, not that of some installed ember
        found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(encoding="utf-8"), re.MULTILINE)
        if found:
            return found.group(1)
    try:
        return metadata.version("ember")
    except metadata.PackageNotFoundError:
        return "0+unknown"


__version__ = _version()


def version_text(prog: str) -> str:
    """What `PROG --version` prints: the version and the backends built in."""
    from . import _ember
    return f"{prog} {__version__} (backends: {', '.join(_ember.backends())})"
