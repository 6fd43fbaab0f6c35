"""Imports: no cycles among energon's modules (imports inside functions count too), and every
module imports cleanly on its own and in any order, each check in a fresh interpreter."""

from __future__ import annotations

import json

import pytest

from tests.helpers.modules import import_cycles, import_graph, module_files, run_fresh


def _write_package(root, files: dict[str, str]):
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_graph_counts_function_level_relative_and_lazy_imports(tmp_path):
    package = _write_package(
        tmp_path,
        {
            "__init__.py": '_EXPORTS = {"Thing": "pkg.sub.c"}\n',
            "a.py": "def f():\n    from pkg import b\n",
            "b.py": "from .sub import c\n",
            "sub/__init__.py": "",
            "sub/c.py": "from pkg.sub.d import name\nfrom pkg import Thing\n",
            "sub/d.py": "import os\nfrom pkg.a import f\n",
        },
    )
    assert import_graph(package) == {
        "pkg": set(),
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.sub.c"},
        "pkg.sub": set(),
        "pkg.sub.c": {"pkg.sub.d"},  # ``from pkg import Thing`` is c itself
        "pkg.sub.d": {"pkg.a"},
    }
    assert import_cycles(import_graph(package)) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.sub.d"]]


def test_cycle_finder_reports_each_strongly_connected_group():
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": set(), "d": {"e"}, "e": {"f"}, "f": {"d"}}
    assert import_cycles(graph) == [["a", "b"], ["d", "e", "f"]]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycles():
    assert import_cycles(import_graph()) == []


# Heavy third-party modules are imported once; then energon's package tree is walked with a fork
# per module: each module is imported in a fork of its parent package's process, so it starts with
# exactly what a fresh ``import energon.a.b`` has loaded when b's own code runs (energon, then
# energon.a, each imported alone), and its own submodules are checked in forks of it in turn. Python
# imports a module's parent packages first, so this is the state a fresh interpreter would have,
# without re-importing the parents (the loader package alone is most of energon) per module.
# A fork does not copy threads: an import that starts one would make the forks differ from fresh
# interpreters, so that is reported as a failure too.
_EACH_ALONE = """
import importlib, json, os, sys, threading, traceback
import numpy, torch  # noqa: F401


def import_then_children(name, names):
    threads = threading.active_count()
    importlib.import_module(name)
    if threading.active_count() != threads:
        raise RuntimeError(f"importing {name} started a thread: {threading.enumerate()}")
    result = {"checked": [name], "failed": {}}
    for child in names:
        if nearest_parent(child, names) == name:
            below = in_a_fork(child, names)
            result["checked"] += below["checked"]
            result["failed"].update(below["failed"])
    return result


def nearest_parent(name, names):
    # the closest enclosing package in the list (a folder without __init__.py is not in it)
    parts = name.split(".")
    for end in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:end]) in names:
            return ".".join(parts[:end])
    return None


def in_a_fork(name, names):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            result = import_then_children(name, names)
        except BaseException:
            result = {"checked": [name], "failed": {name: traceback.format_exc()[-2000:]}}
        with os.fdopen(write, "w") as pipe:
            pipe.write(json.dumps(result))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        report = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not report:
        return {"checked": [name], "failed": {name: f"exit status {status}"}}
    return json.loads(report)


names = sys.argv[1:]
print(json.dumps(in_a_fork(min(names, key=len), names)))
"""

_ALL_IN_ORDER = """
import importlib, json, random, sys
names = sys.argv[2:]
random.Random(int(sys.argv[1])).shuffle(names)
for name in names:
    importlib.import_module(name)
print(json.dumps(names))
"""


def test_every_module_imports_on_its_own():
    modules = list(module_files())
    # a fork per module: 212-240 s were seen at load 16-20 on 2 cores, close to a 300 s limit
    proc = run_fresh(_EACH_ALONE, *modules, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["failed"] == {}
    assert sorted(result["checked"]) == sorted(modules)  # no module is left out of the walk


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_all_modules_import_in_a_random_order(seed):
    modules = list(module_files())
    proc = run_fresh(_ALL_IN_ORDER, str(seed), *modules)
    assert proc.returncode == 0, proc.stderr[-3000:]
    order = json.loads(proc.stdout)
    assert sorted(order) == sorted(modules) and order != modules
