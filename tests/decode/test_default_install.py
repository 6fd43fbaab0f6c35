"""A plain ``pip install energon-loader`` gets the fast JPEG path (simplejpeg) wherever PyPI has a
simplejpeg wheel, and falls back to Pillow elsewhere (no compiler asked for)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from packaging.requirements import Requirement

from energon.decode.jpeg import fast_jpeg_available
from tests.helpers.paths import REPO_ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; CI runs 3.11


def _default_requirement(name: str) -> Requirement:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    found = [Requirement(text) for text in project["dependencies"]]
    matches = [r for r in found if r.name == name]
    assert len(matches) == 1, f"{name} is not a default dependency"
    return matches[0]


def _environment(sys_platform: str, machine: str, python: str) -> dict[str, str]:
    return {"sys_platform": sys_platform, "platform_machine": machine, "python_version": python}


# simplejpeg 1.9.0's wheels on PyPI (pip install --dry-run --only-binary=:all: --platform ...,
# checked 2026-11-27): glibc Linux x86_64 / aarch64, macOS x86_64 / arm64, Windows AMD64, Windows
# ARM64 from Python 3.11; none for ppc64le or s390x (and none for musl, which torch lacks too).
WHEELS = [
    (_environment("linux", "x86_64", "3.10"), True),
    (_environment("linux", "aarch64", "3.13"), True),
    (_environment("darwin", "arm64", "3.12"), True),
    (_environment("darwin", "x86_64", "3.10"), True),
    (_environment("win32", "AMD64", "3.11"), True),
    (_environment("win32", "ARM64", "3.13"), True),
    (_environment("win32", "ARM64", "3.10"), False),
    (_environment("linux", "ppc64le", "3.12"), False),
    (_environment("linux", "s390x", "3.12"), False),
]


@pytest.mark.parametrize(("environment", "has_wheel"), WHEELS)
def test_simplejpeg_is_a_default_dependency_where_it_has_wheels(environment, has_wheel):
    requirement = _default_requirement("simplejpeg")
    assert requirement.marker is not None
    assert requirement.marker.evaluate(environment) is has_wheel


def test_this_install_decodes_jpegs_on_the_fast_path(monkeypatch):
    """Where the marker holds, the installed package has simplejpeg and uses it."""
    monkeypatch.delenv("ENERGON_NO_FAST_JPEG", raising=False)
    requirement = _default_requirement("simplejpeg")
    if not requirement.marker.evaluate():
        pytest.skip(f"simplejpeg has no wheel for {sys.platform}; JPEGs decode with Pillow here")
    assert importlib.util.find_spec("simplejpeg") is not None
    assert fast_jpeg_available()
