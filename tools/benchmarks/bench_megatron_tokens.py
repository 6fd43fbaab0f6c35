"""Token-dataset throughput: windows of 2048 tokens per second, ours vs megatron-core's GPTDataset.

Both read the same windows from the same ``.bin/.idx`` and the same index cache (megatron-core runs
in the side venv ``.cache/mcore-venv`` built by the tests; skipped if absent), single process, no
attention mask (``create_attention_mask=False``, what fused attention kernels use). A checksum over
the tokens shows both served the same data. Also: the raw window read (no tensors) and mock mode.

    python tools/benchmarks/bench_megatron_tokens.py [--tokens 20000000] [--samples 4000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

import numpy as np  # noqa: E402

from energon.megatron.gpt_dataset import GPTConfig, build_gpt_datasets  # noqa: E402
from energon.megatron.indexed import TokenFileWriter  # noqa: E402

ROOT = os.path.join(_REPO_ROOT, "bench_data", "megatron_tokens")
MCORE_PYTHON = os.path.join(_REPO_ROOT, ".cache", "mcore-venv", "bin", "python")
SEQ = 2048

MCORE = r"""
import json, sys, time
from collections import OrderedDict
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
job = json.loads(sys.argv[1])
class Tok:
    unique_identifiers = OrderedDict([("class", "Bench")]); vocab_size = 32000; eod = 0; pad = -1
cfg = GPTDatasetConfig(random_seed=1234, sequence_length=job["seq"], blend=([job["prefix"]], None),
    split="100,0,0", path_to_cache=job["cache"], tokenizer=Tok(), reset_position_ids=False,
    reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False)
ds = BlendedMegatronDatasetBuilder(GPTDataset, [job["samples"], None, None], lambda: True, cfg).build()[0]
ds[0]
t0 = time.perf_counter(); checksum = 0
for k in range(job["samples"]):
    checksum += int(ds[k]["tokens"].sum())
print(json.dumps({"seconds": time.perf_counter() - t0, "checksum": checksum}))
"""


def make_corpus(num_tokens: int) -> str:
    prefix = os.path.join(ROOT, f"corpus_{num_tokens}")
    if os.path.exists(prefix + ".idx"):
        return prefix
    os.makedirs(ROOT, exist_ok=True)
    rng = np.random.default_rng(0)
    written = 0
    with TokenFileWriter(prefix, dtype=np.uint16) as w:
        while written < num_tokens:
            n = int(rng.integers(50, 8000))
            w.add_document([rng.integers(1, 32000, n, dtype=np.uint16)])
            written += n
    return prefix


def timed(fn, samples: int) -> tuple[float, int]:
    fn(0)
    t0 = time.perf_counter()
    checksum = 0
    for k in range(samples):
        checksum += int(fn(k).sum())
    return time.perf_counter() - t0, checksum


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20_000_000)
    parser.add_argument("--samples", type=int, default=4000)
    args = parser.parse_args()
    prefix = make_corpus(args.tokens)
    cache = os.path.join(ROOT, "cache")
    config = GPTConfig(
        sequence_length=SEQ,
        split="100,0,0",
        tokenizer={"class": "Bench"},
        eod_token=0,
        path_to_cache=cache,
        create_attention_mask=False,
    )
    ds = build_gpt_datasets([prefix], [args.samples, None, None], config)[0]
    rows = []
    sec, ours_sum = timed(lambda k: ds[k]["tokens"], args.samples)
    rows.append(("energon GPTTokenDataset (batch dict)", sec, ours_sum))
    sec, raw_sum = timed(lambda k: ds.window(k)[:-1], args.samples)
    rows.append(("energon window only (numpy, no tensors)", sec, raw_sum))
    mock = build_gpt_datasets(
        None,
        [args.samples, None, None],
        GPTConfig(sequence_length=SEQ, split="1,0,0", mock=True, create_attention_mask=False),
    )[0]
    sec, mock_sum = timed(lambda k: mock[k]["tokens"], args.samples)
    rows.append(("energon mock mode (no I/O)", sec, mock_sum))
    if os.path.exists(MCORE_PYTHON):
        job = {"prefix": prefix, "cache": cache, "samples": args.samples, "seq": SEQ}
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        out = (
            subprocess.run(
                [MCORE_PYTHON, "-c", MCORE, json.dumps(job)],
                capture_output=True,
                text=True,
                env=env,
                check=True,
                cwd="/",
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        result = json.loads(out)
        rows.append(
            ("megatron-core GPTDataset (same windows)", result["seconds"], result["checksum"])
        )
    else:
        print(f"# megatron-core side venv not found at {MCORE_PYTHON}: run the compat tests first")
    print(f"{args.tokens:,} tokens, seq {SEQ}, {args.samples} windows, 1 process")
    print("| reader | windows/s | checksum equal to ours |")
    print("|---|---|---|")
    for name, sec, checksum in rows:
        same = "mock data" if "mock" in name else ("yes" if checksum == ours_sum else "NO")
        print(f"| {name} | {args.samples / sec:,.0f} | {same} |")


if __name__ == "__main__":
    main()
