"""ember's version: the installed distribution's, else pyproject.toml's (a source checkout run
with PYTHONPATH); the `--version` every ember command takes and `ember --system-info`."""
from __future__ import annotations

import argparse
import os
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


class _Version(argparse.Action):
    """`--version`: prints version_text(prog) and exits (the text is made only when asked for)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0,
                         help=help or "print the version and the backends built in, then exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text(parser.prog))
        parser.exit()


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action=_Version)


def system_info() -> str:
    """What `ember --system-info` prints: version, SIMD level of the CPU kernels, backends built in,
    CUDA devices with their memory."""
    from . import _ember
    from .devices import cuda_devices
    lines = [f"ember {__version__}", f"CPU SIMD level: {_ember.simd_level()} ({os.cpu_count()} logical cores)",
             f"backends: {', '.join(_ember.backends())}"]
    devices = cuda_devices()
    if not devices:
        lines.append("CUDA devices: none" + ("" if "cuda" in _ember.backends() else " (this build has no CUDA "
                                                                                  "backend)"))
    for d in devices:
        lines.append(f"CUDA device {d.index}: {d.name}, {d.free_bytes >> 20} MiB free of {d.total_bytes >> 20} MiB")
    return "\n".join(lines)
