"""Shared helpers (no tests) for comparing with the real megatron-core, run as a black box in a side venv.

The venv (``.cache/mcore-venv``) is created on first use with CPU torch first, then megatron-core,
then energon's own pure-python dependencies (energon runs there from the source tree); a file
lock keeps parallel pytest workers from building it twice. Not a test module itself.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO_ROOT

MCORE_VENV = REPO_ROOT / ".cache" / "mcore-venv"
MCORE_BASE_READY = MCORE_VENV / ".energon-mcore-ready"  # torch + megatron-core + psutil
MCORE_READY = MCORE_VENV / ".energon-mcore-ready-2"  # ... plus energon's own pure-python deps
MCORE_PYTHON = MCORE_VENV / "bin" / "python"
# energon itself is not installed there (examples run with PYTHONPATH=<repo>); numpy comes with mcore
ENERGON_DEPS = ["pyyaml", "pillow", "click", "tqdm", "braceexpand"]


def _create_venv() -> str | None:
    steps = []
    if not MCORE_BASE_READY.is_file():  # an existing venv only gets the missing energon deps
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(MCORE_VENV)],
            # CPU torch first, so that megatron-core does not pull CUDA wheels
            [str(MCORE_PYTHON), "-m", "pip", "install", "-q", "torch==2.13.0"],
            [str(MCORE_PYTHON), "-m", "pip", "install", "-q", "megatron-core", "psutil"],
        ]
    steps.append([str(MCORE_PYTHON), "-m", "pip", "install", "-q", *ENERGON_DEPS])
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            return f"{' '.join(step[:4])} failed: {proc.stderr.strip()[-500:]}"
        if step[-1] == "psutil":
            MCORE_BASE_READY.write_text("ok\n")
    MCORE_READY.write_text("ok\n")
    return None


def mcore_python() -> str | None:
    """Path of the side venv's python, or None (with the reason printed) if it cannot be made."""
    if os.environ.get("ENERGON_SKIP_MCORE"):
        return None
    MCORE_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(MCORE_VENV.parent / "mcore-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not MCORE_READY.is_file():
            reason = _create_venv()
            if reason is not None:
                print(f"skipping megatron-core comparisons: {reason}")
                return None
    return str(MCORE_PYTHON)


@pytest.fixture(scope="session")
def mcore() -> str:
    python = mcore_python()
    if python is None:
        pytest.skip("cannot create the megatron-core side venv (see printed reason)")
    return python


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

out = job["out"]
if job.get("write"):
    w = job["write"]
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
if job.get("read"):
    ds = IndexedDataset(job["read"], multimodal=job.get("read_multimodal", False))
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
            for key in ("tokens", "labels", "loss_mask", "position_ids", "attention_mask"):
                np.save(os.path.join(out, f"{i}_s{k}_{key}.npy"), s[key].numpy())
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
