"""Remote loading: the same shards read from local disk, from an S3 API server on loopback through
the loader, and by a plain sequential downloader, all in the same run.

The server is moto in server mode, started as its own process (as a real server would be: it does
not share the loader's interpreter). For each workload a slice of its shards (``--shards``) is
prepared locally and uploaded. Per workload:

- *downloader*: GET every shard whole, one after the other, in 1 MiB reads (best of 3 runs): the
  rate this server delivers these bytes at, expressed in samples/s. This is the limit.
- *local* / *S3*: the loader (batch 32, shuffle buffer 100, slices of 100 samples) with 0 and 2
  workers; S3 goes through ranged GETs of prefetched chunks.
- *faults* (``--faults``): the S3 run with 0 workers again through a proxy that cuts, stalls and
  throttles ranged GETs; its output must equal the clean run's, and the retry counters are shown.

- *link* (``--link 20,16``): reads (downloader and loader) go through an emulated network link in
  its own process: 20 ms before the first byte of every response, 16 MB/s shared by all
  connections. This is the setting the target is about: the network, not the CPU, is the limit.

    python tools/benchmarks/bench_remote.py [--workloads text,captioning] [--shards 2] [--batches 150]
        [--faults] [--link LATENCY_MS,MB_PER_S]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import (  # noqa: E402
    ensure_workload,
    machine_summary,
    print_markdown_table,
    process_tree,
)

YAML = {
    "captioning": "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\n"
    "field_map:\n  image: jpg\n  caption: txt\n",
    "text": "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n",
}
BATCH = 32


def local_copy(workload: str, shards: int, root: str) -> str:
    """A prepared dataset of the first ``shards`` shards of the workload."""
    from energon.prepare.dataset import prepare_dataset

    source = ensure_workload(workload, root)
    target = tempfile.mkdtemp(prefix=f"energon-remote-{workload}-")
    for shard in source.shards[:shards]:
        os.makedirs(os.path.dirname(os.path.join(target, shard)), exist_ok=True)
        shutil.copyfile(os.path.join(source.path, shard), os.path.join(target, shard))
    prepare_dataset(target, split_parts_ratio=[("train", 1.0)], progress=False)
    with open(os.path.join(target, ".nv-meta", "dataset.yaml"), "w") as f:
        f.write(YAML[workload])
    return target


def start_server() -> tuple[subprocess.Popen, str]:
    """moto's S3 server in its own process on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto server did not start")


def start_link(endpoint: str, latency_ms: float, mb_per_s: float) -> tuple[subprocess.Popen, str]:
    """The emulated link (tests/helpers/s3_fault_proxy.py, no faults) in its own process."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.s3_fault_proxy", endpoint]
        + ["--latency-ms", str(latency_ms), "--bandwidth-mbps", str(mb_per_s)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    return proc, proc.stdout.readline().strip()


def use_endpoint(endpoint: str) -> None:
    """Point boto3 (and energon's cached client) at ``endpoint``."""
    from energon.remote import s3

    os.environ["AWS_ENDPOINT_URL"] = endpoint
    s3.reset_client()


def upload(local: str, bucket: str, prefix: str) -> tuple[str, list[str]]:
    """Upload a prepared dataset; returns its URL and the keys of its shards."""
    import boto3

    client = boto3.client("s3")
    if bucket not in [b["Name"] for b in client.list_buckets().get("Buckets", [])]:
        client.create_bucket(Bucket=bucket)
    shards = []
    for dirpath, _, files in os.walk(local):
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            key = f"{prefix}/" + os.path.relpath(path, local).replace(os.sep, "/")
            with open(path, "rb") as f:
                client.put_object(Bucket=bucket, Key=key, Body=f.read())
            if name.endswith(".tar"):
                shards.append(key)
    return f"s3://{bucket}/{prefix}", shards


def download_rate(bucket: str, keys: list[str], repeats: int = 3) -> tuple[float, int]:
    """(best seconds to GET all ``keys`` whole, one after the other, in 1 MiB reads; bytes)."""
    import boto3

    client = boto3.client("s3")
    best, total = float("inf"), 0
    for _ in range(repeats):
        total = 0
        t = time.perf_counter()
        for key in keys:
            body = client.get_object(Bucket=bucket, Key=key)["Body"]
            while chunk := body.read(1 << 20):
                total += len(chunk)
        best = min(best, time.perf_counter() - t)
    return best, total


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loader(path: str, workers: int):
    from energon import WorkerConfig, get_loader, get_train_dataset

    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    ds = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=BATCH,
        shuffle_buffer_size=100,
        max_samples_per_sequence=100,
    )
    return get_loader(ds)


def loader_cpu(exclude: int) -> float:
    """CPU seconds of this process and its workers (not of the server process ``exclude``)."""
    total = 0.0
    for pid in process_tree():
        if pid != exclude:
            try:
                total += cpu_seconds(pid)
            except (OSError, IndexError):
                pass  # exited meanwhile
    return total


def rate(
    path: str, workers: int, batches: int, server_pid: int
) -> tuple[float, float, float, float]:
    """(samples/s after the first batch, seconds to the first batch, loader CPU ms per 1,000
    samples after the first batch: main process + workers, server excluded, samples/s from the
    start: what a link-bound run compares with the downloader, which also starts from nothing)."""
    t0 = time.perf_counter()
    it = iter(loader(path, workers))
    next(it)
    ttfb = time.perf_counter() - t0
    cpu = loader_cpu(server_pid)
    t = time.perf_counter()
    for _ in range(batches):
        next(it)
    seconds = time.perf_counter() - t
    cpu = loader_cpu(server_pid) - cpu
    from_start = (batches + 1) * BATCH / (ttfb + seconds)
    return batches * BATCH / seconds, ttfb, cpu * 1e6 / (batches * BATCH), from_start


def keys_of(path: str, workers: int, batches: int) -> list:
    it = iter(loader(path, workers))
    return [list(next(it).__key__) for _ in range(batches)]


def fault_run(url: str, endpoint: str, batches: int) -> dict:
    """The 0-worker S3 run through the fault proxy: same keys? which faults, how many retries?"""
    from energon import remote_stats
    from energon.remote import s3
    from energon.source.shard_reader import reset_shard_reader
    from tests.helpers.s3_fault_proxy import start_fault_proxy

    clean = keys_of(url, 0, batches)
    proxy_url, handler, stop = start_fault_proxy(endpoint)
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "ENERGON_S3_READ_TIMEOUT")}
    os.environ.update(AWS_ENDPOINT_URL=proxy_url, ENERGON_S3_READ_TIMEOUT="0.5")
    os.environ["ENERGON_CACHE_DIR"] = tempfile.mkdtemp(prefix="energon-cache-faults-")
    s3.reset_client()
    reset_shard_reader()  # no chunks cached by the clean run
    remote_stats().reset()
    try:
        faulty = keys_of(url, 0, batches)
    finally:
        stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        s3.reset_client()
    stats = remote_stats().as_dict()
    return {"identical": faulty == clean, **handler.faults, **stats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="text,captioning")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--root", default="bench_data")
    parser.add_argument("--faults", action="store_true", help="also run through the fault proxy")
    parser.add_argument(
        "--link",
        metavar="LATENCY_MS,MB_PER_S",
        help="read through an emulated link (first-byte latency, bandwidth shared by all "
        "connections), e.g. 20,16; uploads go to the server directly",
    )
    args = parser.parse_args()

    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    os.environ.setdefault("ENERGON_CACHE_DIR", tempfile.mkdtemp(prefix="energon-cache-"))
    server, endpoint = start_server()
    link, read_endpoint = None, endpoint
    if args.link:
        link, read_endpoint = start_link(endpoint, *map(float, args.link.split(",")))
    rows, fault_rows = [], []
    try:
        for workload in args.workloads.split(","):
            use_endpoint(endpoint)
            local = local_copy(workload, args.shards, args.root)
            url, keys = upload(local, "energon-bench", workload)
            use_endpoint(read_endpoint)
            seconds, nbytes = download_rate("energon-bench", keys)
            with open(os.path.join(local, ".nv-meta", ".info.json")) as f:
                samples = sum(json.load(f)["shard_counts"].values())
            limit = samples / seconds
            for workers in [int(w) for w in args.workers.split(",")]:
                local_rate, _, local_cpu, _ = rate(local, workers, args.batches, server.pid)
                server_cpu = cpu_seconds(server.pid)
                remote_rate, remote_ttfb, remote_cpu, from_start = rate(
                    url, workers, args.batches, server.pid
                )
                server_cpu = cpu_seconds(server.pid) - server_cpu
                rows.append(
                    (
                        workload,
                        workers,
                        f"{nbytes / seconds / 1e6:.0f} MB/s = {limit:,.0f}",
                        round(local_rate),
                        round(remote_rate),
                        round(from_start),
                        f"{from_start / limit:.2f}",
                        f"{remote_rate / min(limit, local_rate):.2f}",
                        round(remote_ttfb, 3),
                        f"{local_cpu:.0f} / {remote_cpu:.0f}",
                        f"{server_cpu:.2f}",
                    )
                )
            if args.faults:
                use_endpoint(endpoint)
                fault_rows.append((workload, *fault_run(url, endpoint, 20).values()))
            shutil.rmtree(local, ignore_errors=True)
    finally:
        for process in (link, server):
            if process is not None:
                process.terminate()
                process.wait()
    if args.link:
        latency, bandwidth = args.link.split(",")
        print(f"Reads through an emulated link: {latency} ms first-byte latency, {bandwidth} MB/s")
    print(machine_summary())
    print_markdown_table(
        (
            "workload",
            "workers",
            "downloader (limit) samples/s",
            "local samples/s",
            "S3 samples/s",
            "S3 samples/s from start",
            "S3 from start / limit",
            "S3 / min(limit, local)",
            "S3 TTFB s",
            "loader CPU ms/1k samples local / S3",
            "server CPU s",
        ),
        rows,
    )
    if fault_rows:
        print()
        print_markdown_table(
            (
                "workload",
                "output identical",
                "cut bodies",
                "503 SlowDown",
                "stalls",
                "requests",
                "retries",
                "throttled",
                "hedged",
                "bytes read",
                "bytes written",
                "wait s",
            ),
            fault_rows,
        )


if __name__ == "__main__":
    main()
