"""Time of megatron-core's blend-index rule (``build_blending_indices``) in its implementations.

Scenarios: 3 datasets x 10M samples and 1,000 datasets x 10M samples (random weights, seed 0).

- ``before``: the previous Python loop (one numpy argmax per sample), timed over the first
  ``--before-samples`` samples and extrapolated linearly (the loop's cost per sample is constant);
- ``python``: today's pure-Python fallback (plain floats for few datasets), timed the same way;
- ``native``: today's default, the C loop compiled on first use (``energon.megatron.blend_native``),
  full size; its first-use compile time is reported separately;
- ``megatron-core``: its C++ helper in the side venv of the compat tests (``.cache/mcore-venv``),
  full size, when that venv exists; also checks that its arrays equal ours.

    python tools/benchmarks/bench_blend_indices.py [--size 10000000] [--datasets 3,1000] [--before-samples 300000]

Measured numbers are in docs/benchmarks.md (section "Blend indices").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

import numpy as np  # noqa: E402
from bench_common import machine_summary, print_markdown_table  # noqa: E402

from energon import native  # noqa: E402
from energon.megatron import blend_native  # noqa: E402
from energon.megatron import gpt_indices as gi  # noqa: E402

MCORE_PYTHON = os.path.join(_REPO_ROOT, ".cache", "mcore-venv", "bin", "python")


def before_loop(weights: np.ndarray, size: int) -> np.ndarray:
    """The implementation this replaced (kept here only to time it)."""
    w = np.asarray(weights, dtype=np.float64)
    counts = np.zeros(len(w), dtype=np.float64)
    dataset_index = np.zeros(size, dtype=np.int16)
    sample_index = np.zeros(size, dtype=np.int64)
    for i in range(size):
        d = int(np.argmax(w * max(float(i), 1.0) - counts))
        dataset_index[i] = d
        sample_index[i] = counts[d]
        counts[d] += 1
    return dataset_index


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


def mcore_time(weights: np.ndarray, size: int, ours: np.ndarray) -> dict | None:
    if not os.path.exists(MCORE_PYTHON):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        np.save(os.path.join(tmp, "w.npy"), weights)
        np.save(os.path.join(tmp, "ours.npy"), ours)
        script = f"""
import time, numpy as np
from megatron.core.datasets import helpers_cpp
w = np.load({os.path.join(tmp, "w.npy")!r})
di = np.zeros({size}, dtype=np.int16); si = np.zeros({size}, dtype=np.int64)
t = time.perf_counter()
helpers_cpp.build_blending_indices(di, si, w, len(w), {size}, False)
t = time.perf_counter() - t
print(t, bool(np.array_equal(di, np.load({os.path.join(tmp, "ours.npy")!r}))))
"""
        proc = subprocess.run([MCORE_PYTHON, "-c", script], capture_output=True, text=True)
        if proc.returncode != 0:
            return {"error": proc.stderr.strip()[-300:]}
        seconds, equal = proc.stdout.split()
        return {"seconds": float(seconds), "equal": equal == "True"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=10_000_000)
    parser.add_argument("--datasets", default="3,1000")
    parser.add_argument("--before-samples", type=int, default=300_000)
    args = parser.parse_args()

    compile_start = time.perf_counter()
    fresh = not os.path.isfile(native.library_path("blend", blend_native.SOURCE))
    lib = blend_native.load()
    compile_s = time.perf_counter() - compile_start
    print(
        f"native helper: {'built' if fresh else 'cached'} in {compile_s:.2f} s, available={lib is not None}"
    )
    results = []
    for num in [int(v) for v in args.datasets.split(",")]:
        rng = np.random.default_rng(0)
        w = rng.random(num)
        w = w / w.sum()
        part = min(args.before_samples, args.size)
        scale = args.size / part
        t_before, ref = timed(before_loop, w, part)
        t_python, py = timed(gi.blending_indices_python, w, part)
        assert np.array_equal(ref, py[0])
        row = {
            "datasets": num,
            "size": args.size,
            "before_s_extrapolated": round(t_before * scale, 2),
            "python_s_extrapolated": round(t_python * scale, 2),
        }
        if lib is not None:
            t_native, nat = timed(blend_native.blend, lib, w, args.size)
            assert np.array_equal(nat[0][:part], ref)
            row["native_s"] = round(t_native, 3)
            row["speedup_vs_before"] = round(t_before * scale / t_native, 1)
            mc = mcore_time(w, args.size, nat[0])
            if mc is not None:
                row["megatron_core_cpp"] = mc
        results.append(row)
        print(json.dumps(row))
    print_table(results)


def print_table(results: list[dict]) -> None:
    """The rows as the page shows them: each implementation's seconds for the same indices."""
    print(machine_summary())
    headers = [
        "datasets x samples",
        "before (numpy argmax per sample), s",
        "Python fallback, s",
        "default (C loop), s",
        "megatron-core C++, s",
        "megatron-core arrays equal",
    ]
    rows = []
    for row in results:
        mcore = row.get("megatron_core_cpp") or {}
        rows.append(
            [
                f"{row['datasets']:,} x {row['size']:,}",
                f"{row['before_s_extrapolated']} (extrapolated)",
                f"{row['python_s_extrapolated']} (extrapolated)",
                row.get("native_s", "no compiler"),
                mcore.get("seconds", "no .cache/mcore-venv"),
                mcore.get("equal", ""),
            ]
        )
    print_markdown_table(headers, rows)


if __name__ == "__main__":
    main()
