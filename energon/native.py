"""Tiny C loops compiled on first use with ``cc`` (optional: every user has a Python fallback).

Some plan arithmetic is inherently sequential (each choice depends on the previous one), so in
Python it costs microseconds per step. A module that wants a C version of such a loop passes its
source here; :func:`load_library` builds it once into a per-user cache (named by a hash of source,
flags, platform and Python ABI, built in a temporary file and renamed into place, so concurrent
first users are safe) and loads it with ``ctypes``. Without a compiler, or with
``ENERGON_NO_NATIVE=1``, it returns None and the caller runs its Python code. Callers keep the C
bit-identical to their Python (IEEE float64, no fused multiply-add, no ``-ffast-math``) and prove
it with tests.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading

FLAGS = ("-O2", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC")
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}


def disabled() -> bool:
    return bool(os.environ.get("ENERGON_NO_NATIVE"))


def cache_dir() -> str:
    base = os.environ.get("ENERGON_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "energon",
    )
    return os.path.join(base, "native")


def library_path(name: str, source: str, flags: tuple[str, ...] = FLAGS) -> str:
    """Where the library of ``source`` lives (keyed by source, flags, platform and Python ABI)."""
    digest = hashlib.sha256(
        "\0".join([source, *flags, sysconfig.get_platform(), sys.implementation.cache_tag]).encode()
    ).hexdigest()[:16]
    return os.path.join(cache_dir(), f"{name}-{digest}.so")


def _compile(source: str, target: str, flags: tuple[str, ...]) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler (cc) found")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(target)) as tmp:
        src = os.path.join(tmp, "lib.c")
        with open(src, "w") as f:
            f.write(source)
        out = os.path.join(tmp, "lib.so")
        subprocess.run(
            [compiler, *flags, src, "-o", out], check=True, capture_output=True, timeout=120
        )
        os.replace(out, target)


def load_library(name: str, source: str, flags: tuple[str, ...] = FLAGS) -> ctypes.CDLL | None:
    """The compiled ``source`` (built on first use), or None where that is impossible or disabled."""
    if disabled():
        return None
    path = library_path(name, source, flags)
    with _lock:
        if path in _loaded:
            return _loaded[path]
        lib = None
        try:
            if not os.path.isfile(path):
                _compile(source, path, flags)
            lib = ctypes.CDLL(path)
        except (OSError, subprocess.SubprocessError):
            lib = None
        _loaded[path] = lib
        return lib
