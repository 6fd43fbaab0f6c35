"""The reference side venv's fixture, for every test of this folder (``tests/helpers/ref_venv.py``)."""

from tests.helpers.ref_venv import ref_python  # noqa: F401
