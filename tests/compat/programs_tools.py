"""Reference-style programs (see programs.py)."""

from tests.compat.programs import program  # noqa: F401
