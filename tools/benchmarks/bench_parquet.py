"""Parquet against tar shards and against Hugging Face ``datasets`` streaming, on the same data.

One workload is written once as tar shards (energon's demo generator, prepared) and as Parquet
files (the same rows, one file per shard, ``--row-group`` rows per row group, prepared). Then, in
one process each (0 workers, batch 32, shuffle buffer 100, slices of 100 samples):

- *raw Parquet read*: pyarrow reading the files' row groups and each row's values (the baseline:
  no loader, no shuffle);
- *energon tar* / *energon parquet*: the loader over the tar and the Parquet dataset;
- *HF datasets*: ``load_dataset("parquet", ..., streaming=True)`` (an ``IterableDataset``),
  ``.shuffle(buffer_size=100)``, batches of 32 rows; JPEG bytes decoded with the same decoder
  energon uses (so every row delivers the same decoded data).

Each reports samples/s over ``--batches`` batches after the first, and the time to the first batch.
Resume: save at batch ``--batches // 2`` (energon: ``save_state_rank``; HF: ``state_dict``), build a
fresh loader, restore (``restore_state_rank`` / ``load_state_dict``) and time to its first batch;
"exact" says whether the next 5 batches equal those of the uninterrupted run.

    python tools/benchmarks/bench_parquet.py [--workload captioning|text] [--samples 4000]
        [--row-group 100] [--batches 60] [--root /tmp/bench_parquet]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import machine_summary, print_markdown_table  # noqa: E402

BATCH = 32
YAML = {
    "captioning": "sample_type: {__module__: energon, __class__: CaptioningSample}\n"
    "field_map: {image: jpg, caption: txt}\n",
    "text": "sample_type: {__module__: energon, __class__: TextSample}\nfield_map: {text: txt}\n",
}


def make_data(root: str, workload: str, samples: int, row_group: int) -> tuple[str, str]:
    """(tar dataset, Parquet dataset) with the same rows, generated once per settings."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from energon.demo import write_captioning_shards, write_text_shards
    from energon.format.parquet import prepare_parquet
    from energon.prepare.dataset import prepare_dataset

    base = os.path.join(root, f"{workload}-{samples}-{row_group}")
    tar_root, pq_root = os.path.join(base, "tar"), os.path.join(base, "parquet")
    if os.path.exists(os.path.join(pq_root, ".nv-meta", "dataset.yaml")):
        return tar_root, pq_root
    shutil.rmtree(base, ignore_errors=True)
    shards = max(1, samples // 500)
    if workload == "captioning":
        write_captioning_shards(
            tar_root, num_samples=samples, num_shards=shards, min_size=128, max_size=320
        )
    else:
        write_text_shards(tar_root, num_samples=samples, num_shards=shards)
    prepare_dataset(tar_root, progress=False, num_workers=2)
    with open(os.path.join(tar_root, ".nv-meta", "dataset.yaml"), "w") as f:
        f.write(YAML[workload])
    for shard in sorted(os.listdir(os.path.join(tar_root, "parts"))):
        if not shard.endswith(".tar"):
            continue
        columns = _shard_columns(os.path.join(tar_root, "parts", shard))
        os.makedirs(os.path.join(pq_root, "parts"), exist_ok=True)
        target = os.path.join(pq_root, "parts", shard[: -len(".tar")] + ".parquet")
        pq.write_table(pa.table(columns), target, row_group_size=row_group)
    prepare_parquet(pq_root, progress=False)
    with open(os.path.join(pq_root, ".nv-meta", "dataset.yaml"), "w") as f:
        f.write(YAML[workload] + "key_column: key\n")
    return tar_root, pq_root


def _shard_columns(path: str) -> dict[str, list]:
    rows: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            if member.isfile():
                key, _, part = member.name.rsplit("/", 1)[-1].partition(".")
                rows.setdefault(key, {})[part] = tar.extractfile(member).read()
    parts = sorted({p for r in rows.values() for p in r})
    columns: dict[str, list] = {"key": list(rows)}
    for part in parts:
        values = [r[part] for r in rows.values()]
        columns[part] = [v.decode() for v in values] if part == "txt" else values
    return columns


# -- the runs ------------------------------------------------------------------------------------


def energon_loader(path: str):
    from energon import WorkerConfig, get_savable_loader, get_train_dataset

    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=BATCH,
        shuffle_buffer_size=100,
        max_samples_per_sequence=100,
    )
    return get_savable_loader(ds)


def run_energon(path: str, batches: int) -> dict:
    loader = energon_loader(path)
    began = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - began
    began = time.perf_counter()
    keys = []
    for i in range(batches):
        batch = next(it)
        keys.append(list(batch.__key__))
        if i == batches // 2 - 1:
            state = loader.save_state_rank()
            saved_at = i
    rate = batches * BATCH / (time.perf_counter() - began)
    began = time.perf_counter()
    restored = energon_loader(path)
    restored.restore_state_rank(state)
    it2 = iter(restored)
    after = [list(next(it2).__key__)]
    resume = time.perf_counter() - began
    after += [list(next(it2).__key__) for _ in range(4)]
    exact = after == keys[saved_at + 1 : saved_at + 6]
    return {"rate": rate, "first": first, "resume": resume, "exact": exact}


def hf_dataset(path: str, workload: str):
    import datasets

    files = sorted(
        os.path.join(path, "parts", f)
        for f in os.listdir(os.path.join(path, "parts"))
        if f.endswith(".parquet")
    )
    ds = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)
    return ds.shuffle(seed=0, buffer_size=100)


def hf_batches(ds, workload: str):
    from energon.decode.image import IMAGE_MODES, decode_image

    mode = IMAGE_MODES["torchrgb"]
    batch = []
    for row in ds:
        if workload == "captioning":
            row = {
                "key": row["key"],
                "image": decode_image(row["jpg"], mode),
                "caption": row["txt"],
            }
        batch.append(row)
        if len(batch) == BATCH:
            yield batch
            batch = []


def run_hf(path: str, workload: str, batches: int) -> dict:
    began = time.perf_counter()
    ds = hf_dataset(path, workload)
    it = hf_batches(ds, workload)
    next(it)
    first = time.perf_counter() - began
    began = time.perf_counter()
    keys = []
    for i in range(batches):
        keys.append([r["key"] for r in next(it)])
        if i == batches // 2 - 1:
            state = ds.state_dict()
            saved_at = i
    rate = batches * BATCH / (time.perf_counter() - began)
    began = time.perf_counter()
    again = hf_dataset(path, workload)
    again.load_state_dict(state)
    it2 = hf_batches(again, workload)
    after = [[r["key"] for r in next(it2)]]
    resume = time.perf_counter() - began
    after += [[r["key"] for r in next(it2)] for _ in range(4)]
    exact = after == keys[saved_at + 1 : saved_at + 6]
    return {"rate": rate, "first": first, "resume": resume, "exact": exact}


def run_raw(path: str, workload: str, batches: int) -> dict:
    """pyarrow alone: row groups in file order, every row's values (+ the same JPEG decode)."""
    import pyarrow.parquet as pq

    from energon.decode.image import IMAGE_MODES, decode_image

    mode = IMAGE_MODES["torchrgb"]
    files = sorted(os.listdir(os.path.join(path, "parts")))
    wanted = (batches + 1) * BATCH
    began = time.perf_counter()
    count = 0
    for name in files:
        handle = pq.ParquetFile(os.path.join(path, "parts", name))
        for g in range(handle.num_row_groups):
            table = handle.read_row_group(g)
            for row in table.to_pylist():
                if workload == "captioning":
                    decode_image(row["jpg"], mode)
                count += 1
                if count >= wanted:
                    seconds = time.perf_counter() - began
                    return {"rate": count / seconds, "first": None, "resume": None, "exact": None}
    return {
        "rate": count / (time.perf_counter() - began),
        "first": None,
        "resume": None,
        "exact": None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=["captioning", "text"], default="captioning")
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--row-group", type=int, default=100)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--root", default="/tmp/bench_parquet")
    args = parser.parse_args()
    tar_root, pq_root = make_data(args.root, args.workload, args.samples, args.row_group)
    results = {
        "raw Parquet read (pyarrow, in file order)": run_raw(pq_root, args.workload, args.batches),
        "energon, tar shards": run_energon(tar_root, args.batches),
        "energon, Parquet": run_energon(pq_root, args.batches),
        "HF datasets streaming Parquet": run_hf(pq_root, args.workload, args.batches),
    }
    print(f"{machine_summary()}; load average {os.getloadavg()}")
    print(
        f"workload {args.workload}: {args.samples} samples, row groups of {args.row_group} rows, "
        f"{args.batches} batches of {BATCH}"
    )
    rows = []
    for name, r in results.items():
        rows.append(
            [
                name,
                f"{r['rate']:.0f}",
                "" if r["first"] is None else f"{r['first']:.2f}",
                "" if r["resume"] is None else f"{r['resume']:.2f}",
                "" if r["exact"] is None else ("yes" if r["exact"] else "no"),
            ]
        )
    print_markdown_table(
        ["reader", "samples/s", "first batch (s)", "resume to first batch (s)", "exact resume"],
        rows,
    )


if __name__ == "__main__":
    main()
