"""Remote loading: the same dataset read from a local folder and from an S3 API server on loopback
(moto in server mode), in the same run, with 0 and 2 workers.

The dataset is a slice of the text or captioning workload (``--shards``), prepared locally and
uploaded. Every sample is one ranged GET today (no coalescing or prefetch yet), so this measures the
per-request cost of the remote path against local preads.

    python tools/bench_remote.py [--workload text|captioning] [--shards 2] [--batches 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import ensure_workload, machine_summary, print_markdown_table  # noqa: E402

YAML = {
    "captioning": "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\n"
    "field_map:\n  image: jpg\n  caption: txt\n",
    "text": "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n",
}


def local_copy(workload: str, shards: int, root: str) -> str:
    """A prepared dataset of the first ``shards`` shards of the workload."""
    from energon.format.prepare import prepare_dataset

    source = ensure_workload(workload, root)
    target = tempfile.mkdtemp(prefix=f"energon-remote-{workload}-")
    for shard in source.shards[:shards]:
        os.makedirs(os.path.dirname(os.path.join(target, shard)), exist_ok=True)
        shutil.copyfile(os.path.join(source.path, shard), os.path.join(target, shard))
    prepare_dataset(target, split_parts_ratio=[("train", 1.0)], progress=False)
    with open(os.path.join(target, ".nv-meta", "dataset.yaml"), "w") as f:
        f.write(YAML[workload])
    return target


def upload(local: str, bucket: str, endpoint: str) -> str:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=bucket)
    for dirpath, _, files in os.walk(local):
        for name in files:
            path = os.path.join(dirpath, name)
            key = "ds/" + os.path.relpath(path, local).replace(os.sep, "/")
            with open(path, "rb") as f:
                client.put_object(Bucket=bucket, Key=key, Body=f.read())
    return f"s3://{bucket}/ds"


def rate(path: str, workers: int, batches: int) -> tuple[float, float]:
    from energon import WorkerConfig, get_loader, get_train_dataset

    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    t0 = time.perf_counter()
    ds = get_train_dataset(
        path, worker_config=wc, batch_size=32, shuffle_buffer_size=100, max_samples_per_sequence=100
    )
    it = iter(get_loader(ds))
    next(it)
    ttfb = time.perf_counter() - t0
    t = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batches * 32 / (time.perf_counter() - t), ttfb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="text", choices=["text", "captioning"])
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--root", default="bench_data")
    args = parser.parse_args()
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request

    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    os.environ.setdefault("ENERGON_CACHE_DIR", tempfile.mkdtemp(prefix="energon-cache-"))
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        local = local_copy(args.workload, args.shards, args.root)
        url = upload(local, "energon-bench", endpoint)
        from energon import remote_stats

        rows = []
        for workers in [int(w) for w in args.workers.split(",")]:
            local_rate, local_ttfb = rate(local, workers, args.batches)
            before = remote_stats().requests
            remote_rate, remote_ttfb = rate(url, workers, args.batches)
            rows.append(
                (
                    args.workload,
                    workers,
                    round(local_rate),
                    round(remote_rate),
                    f"{remote_rate / local_rate:.2f}",
                    round(local_ttfb, 3),
                    round(remote_ttfb, 3),
                    remote_stats().requests - before if workers == 0 else "(in workers)",
                )
            )
        print(machine_summary())
        print_markdown_table(
            (
                "workload",
                "workers",
                "local samples/s",
                "S3 (loopback) samples/s",
                "S3 / local",
                "local TTFB s",
                "S3 TTFB s",
                "GET requests (main)",
            ),
            rows,
        )
        shutil.rmtree(local, ignore_errors=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
