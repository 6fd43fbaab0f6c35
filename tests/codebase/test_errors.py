"""One error tree: every exception class energon defines is an ``EnergonError``, defined in
``energon/errors.py`` (whose docstring draws the tree), and keeps the builtin base users catch."""

from __future__ import annotations

import ast
import builtins
import json
import re

import pytest

import energon.errors as errors
from tests.helpers.modules import module_files, run_fresh

# Walks every module in a fresh interpreter: importing them all here would, e.g., install the
# ``megatron.energon`` alias into the test process.
_LIST_EXCEPTIONS = """
import importlib, inspect, json, sys
from energon.errors import EnergonError
found = {}
for name in sys.argv[1:]:
    for value in vars(importlib.import_module(name)).values():
        if inspect.isclass(value) and issubclass(value, BaseException):
            if value.__module__.startswith("energon"):
                found[f"{value.__module__}.{value.__qualname__}"] = issubclass(value, EnergonError)
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def energon_exceptions() -> dict[str, bool]:
    """``module.Class`` -> is it an EnergonError, for every exception class of every module."""
    proc = run_fresh(_LIST_EXCEPTIONS, *module_files())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_every_exception_class_is_an_energon_error(energon_exceptions):
    assert len(energon_exceptions) > 30  # the walk saw the tree, not an empty module list
    assert [name for name, ok in energon_exceptions.items() if not ok] == []


def test_public_exception_classes_are_defined_in_errors(energon_exceptions):
    """Modules re-export their errors; only module-private signals (``_Name``) live elsewhere."""
    elsewhere = [
        name
        for name in energon_exceptions
        if not name.startswith("energon.errors.") and not name.rpartition(".")[2].startswith("_")
    ]
    assert elsewhere == []


def _documented_tree() -> list[tuple[str, str | None, list[str]]]:
    """(class, parent class, builtin bases) for each line of the tree in errors' docstring."""
    rows = []
    parents: list[tuple[int, str]] = []
    for line in errors.__doc__.splitlines():
        m = re.fullmatch(r"( {4,})([A-Z]\w+)(?: \(([\w, ]+)\))?", line)
        if not m:
            continue
        indent, name = len(m.group(1)), m.group(2)
        while parents and parents[-1][0] >= indent:
            parents.pop()
        builtin_bases = [b.strip() for b in m.group(3).split(",")] if m.group(3) else []
        rows.append((name, parents[-1][1] if parents else None, builtin_bases))
        parents.append((indent, name))
    return rows


def test_docstring_draws_the_whole_tree():
    rows = _documented_tree()
    defined = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__ == errors.__name__
    }
    assert sorted(name for name, _, _ in rows) == sorted(defined)
    for name, parent, builtin_bases in rows:
        cls = getattr(errors, name)
        own = [b.__name__ for b in cls.__bases__ if b.__module__ == errors.__name__]
        others = [b.__name__ for b in cls.__bases__ if b.__module__ != errors.__name__]
        assert own == ([parent] if parent else []), name
        assert others == builtin_bases, name
        assert all(isinstance(getattr(builtins, b, None), type) for b in others), name


@pytest.mark.parametrize(
    "old_path, builtin",
    [
        ("energon.metadataset.config.MetadatasetError", ValueError),
        ("energon.source.dataset_config.DatasetConfigError", ValueError),
        ("energon.source.jsonl.JsonlFormatError", ValueError),
        ("energon.remote.msc.TransientRemoteError", ConnectionError),
        ("energon.remote.s3_fast_get.ThrottledError", ConnectionError),
        ("energon.remote.RemoteNotFoundError", FileNotFoundError),
        ("energon.format.tar.TarFormatError", ValueError),
        ("energon.format.split.UnknownSplitError", KeyError),
        ("energon.prepare.dataset.ShardReadError", OSError),
        ("energon.source.webdataset.SampleReadError", ValueError),
        ("energon.av.AVDecodeError", ValueError),
        ("energon.deadline.DecodeTimeoutError", ValueError),
        ("energon.source.fieldmap.FieldAccessError", ValueError),
        ("energon.megatron.indexed.IndexedFormatError", ValueError),
    ],
)
def test_old_import_paths_and_builtin_bases_still_work(old_path, builtin):
    import importlib

    module, _, name = old_path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert cls is getattr(errors, name)
    assert issubclass(cls, errors.EnergonError) and issubclass(cls, builtin)


def test_transient_remote_errors_stay_retryable():
    """``RemoteError`` means final; a transient error must not be one, or retries would stop."""
    pytest.importorskip("botocore")
    from energon.remote.retry import is_transient

    assert is_transient(errors.TransientRemoteError("reset"))
    assert is_transient(errors.ThrottledError("503"))
    assert not is_transient(errors.RemoteError("403"))
    assert not issubclass(errors.TransientRemoteError, errors.RemoteError)


def test_no_module_raises_system_error():
    """``SystemError`` is in ``SYSTEM_EXCEPTIONS`` (never skipped) and means a broken interpreter;
    energon's own failures raise an ``EnergonError`` that says what broke."""
    offenders = []
    for module, path in module_files().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                called = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(called, ast.Name) and called.id == "SystemError":
                    offenders.append(f"{module}:{node.lineno}")
    assert offenders == []


def test_error_policy_never_skips_system_exceptions():
    policy = errors.ErrorPolicy("encode_sample", errors.log_exception, tolerance=0)
    with pytest.raises(errors.FatalSampleError, match="SystemError"):
        policy.failed(SystemError("broken interpreter"))
    with pytest.raises(errors.FatalSampleError, match="NameError"):
        policy.failed(NameError("typo"))
    policy.failed(errors.SampleReadError("truncated"))  # a bad sample: skipped and counted
    assert policy.skipped == 1
