"""Shared helpers (no tests) for comparing with the real megatron-core, run as a black box in side venvs.

Two releases are checked: 0.16.1 (``.cache/mcore-venv``, the last one whose metadata accepts Python
3.11) and the current 0.19.x (``.cache/mcore019-venv``). Each venv is created on first use with the
machine's CPU torch first (so that no CUDA wheels are pulled), then megatron-core, then energon's own
pure-python dependencies (energon runs there from the source tree); a file lock per venv keeps
parallel pytest workers from building it twice. Not a test module itself.

Why 0.19 runs on Python 3.11 here: megatron-core 0.17+ declares ``Requires-Python >=3.12``, but NVIDIA
publishes cp311 wheels of it too, and a CPU build of torch for Python 3.12 comes only from PyTorch's
own index (PyPI's torch wheels for Linux declare the CUDA libraries as dependencies). So the 0.19
venv uses the same CPU torch as 0.16.1 and installs megatron-core's cp311 wheel with
``--ignore-requires-python``; its ``megatron.core`` also imports ``triton`` unconditionally, which is
a plain CPU-installable wheel.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.paths import REPO_ROOT
from tests.helpers.side_venv import BUILD_SECONDS, build_once, build_venv, pip_install, run_steps

# energon itself is not installed there (examples run with PYTHONPATH=<repo>); numpy comes with mcore
ENERGON_DEPS = ["pyyaml", "pillow", "click", "tqdm", "braceexpand"]


@dataclasses.dataclass(frozen=True)
class McoreVenv:
    """One side venv: where it lives and the pip steps that make it."""

    version: str
    directory: Path
    base_steps: tuple[tuple[str, ...], ...]  # pip install arguments, in order
    base_marker: str  # torch + megatron-core installed
    marker: str  # ... plus energon's own pure-python deps
    needs_gib: float  # on disk, after sharing identical files with the other venvs

    @property
    def python(self) -> Path:
        return self.directory / "bin" / "python"

    def create(self) -> str | None:
        """Build (or complete) the venv; returns a reason string on failure (the caller writes
        ``marker`` when it succeeds)."""
        deadline = time.monotonic() + BUILD_SECONDS  # for every step together
        if not (self.directory / self.base_marker).is_file():
            reason = build_venv(self.directory, self.base_steps, self.needs_gib, deadline)
            if reason is not None:
                return reason
            (self.directory / self.base_marker).write_text("ok\n")
        return run_steps([pip_install(self.python, ENERGON_DEPS)], deadline)


MCORE_VENVS = {
    "0.16.1": McoreVenv(
        version="0.16.1",
        directory=REPO_ROOT / ".cache" / "mcore-venv",
        base_steps=(("torch==2.13.0",), ("megatron-core==0.16.1", "psutil")),
        base_marker=".energon-mcore-ready",
        marker=".energon-mcore-ready-2",
        needs_gib=1.0,
    ),
    "0.19": McoreVenv(
        version="0.19",
        directory=REPO_ROOT / ".cache" / "mcore019-venv",
        base_steps=(
            # CPU torch first; numpy installed here, so that the next step (which ignores
            # Requires-Python) keeps it rather than building a 3.12-only release from source;
            # triton as in the torchvision venv (torch 2.14.1 pins ~=3.8.0), so its 0.9 GB is shared
            ("torch==2.13.0", "numpy<2.4", "psutil", "triton~=3.8.0"),
            ("--ignore-requires-python", "megatron-core>=0.19,<0.20"),
        ),
        base_marker=".energon-mcore-ready",
        marker=".energon-mcore-ready-2",
        needs_gib=1.5,
    ),
}
MCORE_VENV = MCORE_VENVS["0.16.1"].directory
MCORE_PYTHON = MCORE_VENVS["0.16.1"].python


def mcore_python(version: str = "0.16.1") -> str | None:
    """Path of the side venv's python, or None (with the reason printed) if it cannot be made."""
    if os.environ.get("ENERGON_SKIP_MCORE"):
        return None
    venv = MCORE_VENVS[version]
    reason = build_once(venv.directory, venv.directory / venv.marker, venv.create)
    if reason is not None:
        print(f"skipping megatron-core {version} comparisons: {reason}")
        return None
    return str(venv.python)


@pytest.fixture(scope="session")
def mcore() -> str:
    """megatron-core 0.16.1 (the training example's CPU workarounds are written for it)."""
    python = mcore_python()
    if python is None:
        pytest.skip("cannot create the megatron-core side venv (see printed reason)")
    return python


class McorePython(str):
    """A side venv's python path that also knows its megatron-core release."""

    version: str


@pytest.fixture(scope="session", params=sorted(MCORE_VENVS))
def mcore_any(request) -> McorePython:
    """Every checked megatron-core release in turn (index, cache and sample comparisons)."""
    python = mcore_python(request.param)
    if python is None:
        pytest.skip(
            f"cannot create the megatron-core {request.param} side venv (see printed reason)"
        )
    result = McorePython(python)
    result.version = request.param
    return result


# Runs inside the side venv. argv[1] is a JSON job; it builds the datasets with megatron-core's own
# builder into job["cache"] and writes every index array plus sample windows into job["out"].
MCORE_SCRIPT = r"""
import json, os, sys
from collections import OrderedDict
import numpy as np
import torch

job = json.loads(sys.argv[1])
if not torch.distributed.is_initialized():  # the 0.16.1 BlendedDataset cache path needs a group
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # a file store: no TCP port to collide with parallel test processes
    torch.distributed.init_process_group(
        "gloo", rank=0, world_size=1, init_method="file://" + job["out"] + ".store"
    )

from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
from megatron.core.datasets.utils import get_blend_from_list


class Tok:
    def __init__(self, vocab_size, eod):
        self.unique_identifiers = OrderedDict([("class", "Tok"), ("vocab", vocab_size)])
        self.vocab_size = vocab_size
        self.eod = eod
        self.pad = -1

for io_job in job.get("io", []) + ([job] if job.get("write") or job.get("read") else []):
    out = io_job["out"]
    if io_job.get("write"):
        w = io_job["write"]
        b = IndexedDatasetBuilder(w["prefix"] + ".bin", dtype=getattr(np, w["dtype"]),
                                  multimodal=w.get("multimodal", False))
        for doc in w["docs"]:
            for seq in doc:
                if w.get("multimodal"):
                    b.add_item(torch.tensor(seq), mode=len(seq) % 2)
                else:
                    b.add_item(torch.tensor(seq))
            b.end_document()
        for p in w.get("add_index", []):
            b.add_index(p)
        b.finalize(w["prefix"] + ".idx")
    if io_job.get("read"):
        ds = IndexedDataset(io_job["read"], multimodal=io_job.get("read_multimodal", False))
        np.save(os.path.join(out, "read_lengths.npy"), ds.sequence_lengths)
        np.save(os.path.join(out, "read_docs.npy"), ds.document_indices)
        np.save(os.path.join(out, "read_tokens.npy"), np.concatenate([ds[i][0] if ds.multimodal else ds[i] for i in range(len(ds))]))
for g in job.get("gpts", []):
    out = g["out"]
    os.makedirs(out, exist_ok=True)
    cfg = GPTDatasetConfig(
        random_seed=g["seed"], sequence_length=g["seq"],
        blend=get_blend_from_list(g["blend"]) if g.get("blend") else None,
        blend_per_split=[get_blend_from_list(b) if b else None for b in g["per_split"]] if g.get("per_split") else None,
        split=g.get("split"), path_to_cache=g["cache"], tokenizer=Tok(g.get("vocab", 1000), g.get("eod", 0)),
        reset_position_ids=g.get("reset", False), reset_attention_mask=g.get("reset", False),
        eod_mask_loss=g.get("eod_mask", False), create_attention_mask=True,
        mid_level_dataset_surplus=g.get("surplus", 0.005),
        add_extra_token_to_sequence=g.get("extra", True),
        drop_last_partial_validation_sequence=g.get("drop_last_valid", True),
        **({"inter_document_masking": True} if g.get("inter_document_masking") else {}),
    )
    datasets = BlendedMegatronDatasetBuilder(GPTDataset, g["sizes"], lambda: True, cfg).build()
    summary = []
    for i, ds in enumerate(datasets):
        if ds is None:
            summary.append(None)
            continue
        entry = {"class": type(ds).__name__, "len": len(ds), "hash": ds.unique_description_hash}
        if type(ds).__name__ == "BlendedDataset":
            np.save(os.path.join(out, f"{i}_dataset_index.npy"), ds.dataset_index)
            np.save(os.path.join(out, f"{i}_dataset_sample_index.npy"), ds.dataset_sample_index)
        else:
            for name in ("document_index", "sample_index", "shuffle_index"):
                np.save(os.path.join(out, f"{i}_{name}.npy"), getattr(ds, name))
        n = min(len(ds), g.get("samples", 4))
        for k in range(n):
            s = ds[k]
            for key, value in s.items():
                np.save(os.path.join(out, f"{i}_s{k}_{key}.npy"), np.asarray(value))
            json.dump(sorted(s), open(os.path.join(out, f"{i}_s{k}_keys.json"), "w"))
        summary.append(entry)
    json.dump(summary, open(os.path.join(out, "summary.json"), "w"))
"""


def run_mcore(python: str, job: dict) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [python, "-c", MCORE_SCRIPT, json.dumps(job)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd="/",
    )
    assert proc.returncode == 0, (
        f"megatron-core failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
