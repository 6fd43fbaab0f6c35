"""Simulated start-up of one Megatron data-parallel rank over a blend of many tiny prefixes.

A rank's start-up is: describe the train/valid/test datasets of the blend, learn the train length,
and read its first micro-batch. Measured in a fresh process per scenario (imports not timed):

- ``cold``: no cache; the rank builds every index (what megatron's rank 0 does before the barrier);
- ``cache``: the indices were prepared (``energon prepare-cache``); each ``.idx`` is still opened;
- ``cache+sequences``: also ``energon build-sequences``: no ``.idx`` header is read for counting.

Reported: wall time, bytes read through ``read()`` (``/proc/self/io`` rchar), files opened, and
``.idx`` files opened. Run for rank 0 and the last rank of 4,096 (and of 8): with the cache nothing
depends on the rank or the world size except which window is read.

    python tools/benchmarks/bench_megatron_startup.py [--prefixes 1000] [--world-sizes 8,4096]
"""

from __future__ import annotations

import argparse
import builtins
import json
import os
import subprocess
import sys
import time

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

import numpy as np  # noqa: E402

from energon.megatron.indexed import TokenFileWriter  # noqa: E402

ROOT = os.path.join(_REPO_ROOT, "bench_data", "megatron_startup")
SEQ = 128
TRAIN_ITERS = 4
MICRO_BATCH = 1


def make_prefixes(count: int) -> list[str]:
    """``count`` tiny prefixes (20 documents of up to 200 tokens each), written once."""
    directory = os.path.join(ROOT, f"prefixes_{count}")
    prefixes = [os.path.join(directory, f"p{i:05d}") for i in range(count)]
    if os.path.exists(prefixes[-1] + ".idx"):
        return prefixes
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    for p in prefixes:
        with TokenFileWriter(p, dtype=np.uint16) as w:
            for _ in range(20):
                w.add_document([rng.integers(1, 30000, int(rng.integers(20, 200)))])
    return prefixes


def blend_tokens(prefixes: list[str]) -> list[str]:
    out = []
    for i, p in enumerate(prefixes):
        out += [str(1 + i % 5), p]
    return out


def sizes_for(world_size: int) -> list[int]:
    from energon.megatron.cache import split_sample_counts

    return split_sample_counts(
        global_batch_size=world_size * MICRO_BATCH,
        train_iters=TRAIN_ITERS,
        eval_iters=1,
        eval_interval=TRAIN_ITERS,
    )


def config_for(cache: str | None, sequences: str | None):
    from energon.megatron.gpt_dataset import GPTConfig

    return GPTConfig(
        sequence_length=SEQ,
        split="90,10,0",
        tokenizer={"class": "Bench"},
        path_to_cache=cache,
        sequences_path=sequences,
        create_attention_mask=False,
    )


def simulate_rank(args: argparse.Namespace) -> dict:
    """One rank's start-up in this process; returns the measurements."""
    import torch  # noqa: F401  (imported before timing: start-up of the data path only)

    from energon.megatron.gpt_dataset import build_gpt_datasets

    prefixes = make_prefixes(args.prefixes)
    opened: list[str] = []
    real_open = builtins.open

    def counting_open(file, *a, **k):
        opened.append(os.fspath(file) if not isinstance(file, int) else "<fd>")
        return real_open(file, *a, **k)

    rchar0 = _rchar()
    builtins.open = counting_open
    t0 = time.perf_counter()
    try:
        cache_dir = (
            args.cache if args.scenario != "cold" else os.path.join(ROOT, f"cold-{os.getpid()}")
        )
        sequences = args.sequences if args.scenario == "cache+sequences" else None
        train = build_gpt_datasets(
            blend_tokens(prefixes), sizes_for(args.world_size), config_for(cache_dir, sequences)
        )[0]
        n = len(train)
        first = args.rank * MICRO_BATCH  # megatron's sampler: rank r starts at r * micro-batch
        batch = [train[first + j]["tokens"] for j in range(MICRO_BATCH)]
        elapsed = time.perf_counter() - t0
    finally:
        builtins.open = real_open
    if args.scenario == "cold":
        import shutil

        shutil.rmtree(cache_dir, ignore_errors=True)
    return {
        "scenario": args.scenario,
        "world_size": args.world_size,
        "rank": args.rank,
        "seconds": round(elapsed, 4),
        "read_bytes": _rchar() - rchar0,
        "files_opened": len(opened),
        "idx_opened": sum(f.endswith(".idx") for f in opened),
        "train_len": n,
        "checksum": int(sum(int(t.sum()) for t in batch)),
    }


def _rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def prepare(prefix_count: int, world_size: int) -> tuple[str, str]:
    from energon.megatron.cache import build_sequences, prepare_cache

    prefixes = make_prefixes(prefix_count)
    cache = os.path.join(ROOT, f"cache_{prefix_count}_{world_size}")
    sequences = os.path.join(ROOT, f"sequences_{prefix_count}.json")
    t0 = time.perf_counter()
    build_sequences(blend_tokens(prefixes)[1::2], sequences)
    t1 = time.perf_counter()
    prepare_cache(blend_tokens(prefixes), sizes_for(world_size), config_for(cache, sequences))
    t2 = time.perf_counter()
    print(f"# build-sequences {t1 - t0:.2f} s, prepare-cache (world {world_size}) {t2 - t1:.2f} s")
    return cache, sequences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefixes", type=int, default=1000)
    parser.add_argument("--world-sizes", default="8,4096")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--scenario", default="cache")
    parser.add_argument("--world-size", type=int, default=4096)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--cache", default=None)
    parser.add_argument("--sequences", default=None)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(simulate_rank(args)))
        return
    rows = []
    for world_size in [int(w) for w in args.world_sizes.split(",")]:
        cache, sequences = prepare(args.prefixes, world_size)
        for scenario in ("cold", "cache", "cache+sequences"):
            ranks = [0] if scenario == "cold" else [0, world_size - 1]
            for rank in ranks:
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    "--scenario",
                    scenario,
                    "--prefixes",
                    str(args.prefixes),
                    "--world-size",
                    str(world_size),
                    "--rank",
                    str(rank),
                    "--cache",
                    cache,
                    "--sequences",
                    sequences,
                ]
                rows.append(
                    json.loads(
                        subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                    )
                )
    print(f"{args.prefixes} prefixes, seq {SEQ}, {TRAIN_ITERS} iters, micro-batch {MICRO_BATCH}")
    print(
        "| scenario | world size | rank | start-up s | bytes read | files opened | .idx opened | train windows |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['scenario']} | {r['world_size']} | {r['rank']} | {r['seconds']:.3f} | "
            f"{r['read_bytes']:,} | {r['files_opened']} | {r['idx_opened']} | {r['train_len']:,} |"
        )


if __name__ == "__main__":
    main()
