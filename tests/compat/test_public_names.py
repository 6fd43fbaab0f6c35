"""Every name of the reference's ``megatron.energon.__all__`` exists in ``energon`` and through the
alias, with a compatible signature (same parameter names and kinds; energon may add optional
keyword parameters). Intentional differences are listed here with their reason."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest

import energon
from tests.helpers.paths import REPO_ROOT

pytestmark = pytest.mark.compat

DUMP = r"""
import inspect, json, sys
import megatron.energon as m
out = {}
for name in m.__all__:
    obj = getattr(m, name)
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        params = [[p.name, p.kind.name, p.default is not inspect.Parameter.empty]
                  for p in inspect.signature(target).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        params = None
    out[name] = {"class": inspect.isclass(obj), "params": params}
print("NAMES" + json.dumps(out))
"""

# name -> why energon's signature differs on purpose (or which branch brings the reference's).
INTENTIONAL = {
    "edataclass": "the class is positional-only (a decorator); keyword use is not meaningful",
    "SourceInfo": "fields are not keyword-only (positional construction also works)",
}


@pytest.fixture(scope="module")
def reference_names(ref_python) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [ref_python, "-c", DUMP], capture_output=True, text=True, timeout=600, env=env, cwd="/"
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("NAMES")), None)
    assert line is not None, proc.stderr[-3000:]
    names = json.loads(line[len("NAMES") :])
    assert len(names) == 96
    return names


def _params(obj) -> list | None:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    return [
        [p.name, p.kind.name, p.default is not inspect.Parameter.empty]
        for p in signature.parameters.values()
        if p.name != "self"
    ]


def signature_problems(reference: list, ours: list) -> list[str]:
    """What a call written for the reference could not do with energon's signature."""
    ours_by_name = {p[0]: p for p in ours}
    takes_kwargs = any(kind == "VAR_KEYWORD" for _, kind, _ in ours)
    problems = []
    for name, kind, has_default in reference:
        if name.startswith("_"):
            continue
        mine = ours_by_name.get(name)
        if mine is None:
            if not (takes_kwargs and kind == "KEYWORD_ONLY"):
                problems.append(f"missing parameter {name} ({kind})")
            continue
        if mine[1] != kind:
            problems.append(f"{name}: {kind} in the reference, {mine[1]} here")
        if has_default and not mine[2]:
            problems.append(f"{name}: optional in the reference, required here")
    reference_names = {p[0] for p in reference}
    for name, kind, has_default in ours:
        if (
            name not in reference_names
            and not has_default
            and kind
            not in (
                "VAR_KEYWORD",
                "VAR_POSITIONAL",
            )
        ):
            problems.append(f"extra required parameter {name}")
    return problems


def test_every_reference_name_exists_in_energon(reference_names):
    missing = [name for name in reference_names if not hasattr(energon, name)]
    assert missing == []


def test_signatures_are_compatible(reference_names):
    incompatible = {}
    for name, ref in reference_names.items():
        ours = getattr(energon, name)
        if ref["class"] != inspect.isclass(ours) and name not in INTENTIONAL:
            incompatible[name] = [f"class in the reference: {ref['class']}"]
            continue
        if ref["params"] is None:
            continue
        problems = signature_problems(ref["params"], _params(ours) or [])
        if problems and name not in INTENTIONAL:
            incompatible[name] = problems
    assert incompatible == {}


def test_signature_check_catches_differences():
    """The comparison itself: a renamed, a newly required and a lost optional parameter."""
    reference = [["path", "POSITIONAL_OR_KEYWORD", False], ["limit", "KEYWORD_ONLY", True]]
    assert signature_problems(reference, reference) == []
    renamed = [["p", "POSITIONAL_OR_KEYWORD", False], ["limit", "KEYWORD_ONLY", True]]
    assert "missing parameter path (POSITIONAL_OR_KEYWORD)" in signature_problems(
        reference, renamed
    )
    required = [*reference, ["extra", "KEYWORD_ONLY", False]]
    assert signature_problems(reference, required) == ["extra required parameter extra"]
    lost = [["path", "POSITIONAL_OR_KEYWORD", False], ["limit", "KEYWORD_ONLY", False]]
    assert signature_problems(reference, lost) == [
        "limit: optional in the reference, required here"
    ]


def test_every_reference_name_through_the_alias(reference_names):
    code = (
        "import json, sys, energon, energon.megatron_alias\n"
        "import megatron.energon as m\n"
        "names = json.loads(sys.argv[1])\n"
        "from megatron.energon import *\n"
        "bad = [n for n in names if getattr(m, n) is not getattr(energon, n)]\n"
        "star = [n for n in names if n not in globals()]\n"
        "print(json.dumps([bad, star]))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(sorted(reference_names))],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    bad, star = json.loads(proc.stdout.strip().splitlines()[-1])
    assert bad == [] and star == []


def test_submodule_imports_never_rebind_public_names():
    code = (
        "import energon.megatron_alias\n"
        "import megatron.energon.edataclass, megatron.energon.task_encoder.base\n"
        "import energon.samples.builtin, energon.samples.edataclass\n"
        "from energon import Sample, edataclass\n"
        "from megatron.energon import edataclass as e2\n"
        "import energon, energon.task_encoder\n"
        "assert callable(edataclass) and edataclass is e2, edataclass\n"
        "assert energon.task_encoder.__name__ == 'energon.task_encoder'\n"
        "@edataclass\n"
        "class S(Sample):\n"
        "    x: int\n"
        "print(S(__key__='k', __restore_key__=(), x=1).x)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "1"
