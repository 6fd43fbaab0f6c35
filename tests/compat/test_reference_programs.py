"""Code written for Megatron-Energon runs unchanged on energon through ``import
energon.megatron_alias`` and gives what the reference gives.

Every program of ``programs.py`` is run by the reference (side venv, megatron-energon 7.4) and by
energon on the same datasets; results are compared exactly where the reference is deterministic
(validation order, lengths, types, values) and statistically where it draws at random (blend
weights). All programs of one side run in one process, so each side pays its start-up once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.compat import program_data
from tests.compat.programs import COMPARE, PRELUDE, PROGRAMS, load_all
from tests.helpers.paths import REPO_ROOT

load_all()

pytestmark = pytest.mark.compat


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    return program_data.build(tmp_path_factory.mktemp("programs"))


def _script(alias: bool) -> str:
    parts = ["import energon.megatron_alias\n" if alias else "", PRELUDE]
    for name, body in PROGRAMS.items():
        parts.append(f"def prog_{name}(data):\n{textwrap.indent(body.strip(), '    ')}\n")
    parts.append(
        textwrap.dedent(
            """
            import traceback
            data = json.loads(sys.argv[1])
            results = {}
            for name in json.loads(sys.argv[2]):
                fresh = dict(data, files=data["files"] + "/" + ("ref" if sys.argv[3] == "ref" else "ours"))
                __import__("os").makedirs(fresh["files"], exist_ok=True)
                __import__("shutil").copy(data["files"] + "/hello.txt", fresh["files"] + "/hello.txt")
                try:
                    results[name] = {"ok": globals()["prog_" + name](fresh)}
                except BaseException as e:
                    results[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
            print("RESULTS" + json.dumps(results, default=str))
            """
        )
    )
    return "\n".join(parts)


def _run(python: str, data: dict[str, str], alias: bool, side: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if alias:
        env["PYTHONPATH"] = str(REPO_ROOT)
    proc = subprocess.run(
        [python, "-c", _script(alias), json.dumps(data), json.dumps(list(PROGRAMS)), side],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd="/",
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULTS")), None)
    assert line is not None, f"{side} crashed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(line[len("RESULTS") :])


@pytest.fixture(scope="module")
def results(data, ref_python):
    return {
        "ref": _run(ref_python, data, alias=False, side="ref"),
        "ours": _run(sys.executable, data, alias=True, side="ours"),
    }


def _share(result: dict) -> float:
    return result["a"] / (result["a"] + result["b"])


def _check(kind: str, ref: object, ours: object) -> None:
    if kind == "equal":
        assert ours == ref
    elif kind == "blend_ratio":  # weights 1:4 -> 20% from a
        assert ours["weights"] == ref["weights"]
        assert abs(_share(ref) - 0.2) < 0.05 and abs(_share(ours) - 0.2) < 0.05
    elif kind == "mix_ratio":  # weights 2:8, 10-sample batches
        assert ours["sizes"] == ref["sizes"] == [10] and ours["type"] == ref["type"]
        assert abs(_share(ref) - 0.2) < 0.05 and abs(_share(ours) - 0.2) < 0.05
    elif kind == "blend_ratio_te":  # whole batches of one source, weights 1:4 of the metadataset
        for key in ("len", "n", "pure", "type"):
            assert ours[key] == ref[key], key
        assert ours["pure"] and ours["n"] == 40
        assert abs(_share(ours) - 0.2) < 0.12 and abs(_share(ref) - 0.2) < 0.12
    elif kind == "blend_ratio_v1":  # weights 1:1, and the same validation samples
        assert ours["val"] == ref["val"]
        assert abs(_share(ref) - 0.5) < 0.07 and abs(_share(ours) - 0.5) < 0.07
    elif kind == "nested_blend":  # b2: 1/2, the nested blend 1/2 (a 1/10, b 4/10)
        assert ours["nested"] and ref["nested"]
        for side in (ref, ours):
            total = side["a"] + side["b"] + side["b2"]
            assert abs(side["b2"] / total - 0.5) < 0.06 and abs(side["a"] / total - 0.1) < 0.04
    else:
        raise AssertionError(f"unknown comparison {kind}")


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_matches_reference(results, name):
    ref, ours = results["ref"][name], results["ours"][name]
    assert "ok" in ref, f"the reference fails this program: {ref}"
    assert "ok" in ours, f"energon fails:\n{ours.get('trace', ours)}"
    _check(COMPARE[name], ref["ok"], ours["ok"])
