"""Helpers shared by the benchmarks under tools/: workloads, timing, memory probes, tables.

The benchmarks compare the loader against raw limits measured on the very same bytes, so the
workloads are generated once into a cache directory and reused by every benchmark and run.
Nothing here needs more than the standard library, numpy/Pillow (via energon.demo) and /proc;
energon.demo is imported only when a workload is generated, so that the /proc helpers stay cheap
to import (bench_timed.py uses them in the processes it times).
"""

from __future__ import annotations

import glob
import json
import os
import re
import resource
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from types import TracebackType

# Make `energon` importable when run as `python tools/benchmarks/bench_x.py` from a checkout.
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

DEFAULT_ROOT = "bench_data"
MIB = 1024 * 1024
_MARKER_FILE = ".workload.json"


# ----------------------------------------------------------------------------------------------
# Workloads
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything that determines a workload's bytes; a cached copy is reused only if equal."""

    name: str
    kind: str  # "captioning" or "text"
    num_samples: int
    num_shards: int
    seed: int = 0


WORKLOADS: dict[str, WorkloadSpec] = {
    spec.name: spec
    for spec in (
        WorkloadSpec("captioning", "captioning", num_samples=20_000, num_shards=40),
        WorkloadSpec("text", "text", num_samples=200_000, num_shards=20),
        # Small variants for smoke-testing the benchmark scripts themselves.
        WorkloadSpec("captioning-small", "captioning", num_samples=1_000, num_shards=4),
        WorkloadSpec("text-small", "text", num_samples=10_000, num_shards=4),
    )
}


@dataclass(frozen=True)
class Workload:
    """A generated workload on disk."""

    spec: WorkloadSpec
    path: str  # dataset root (contains parts/ and, once prepared, .nv-meta/)
    shards: list[str]  # relative to path, in shard order
    generation_seconds: float  # how long generating it took (when it was generated)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def shard_paths(self) -> list[str]:
        return [os.path.join(self.path, shard) for shard in self.shards]

    @property
    def total_bytes(self) -> int:
        return sum(os.path.getsize(path) for path in self.shard_paths)


def _generate(spec: WorkloadSpec, path: str, progress: bool) -> list[str]:
    from energon.demo import write_captioning_shards, write_text_shards

    if spec.kind == "captioning":
        writer = write_captioning_shards
    elif spec.kind == "text":
        writer = write_text_shards
    else:
        raise ValueError(f"unknown workload kind {spec.kind!r}")
    return writer(
        path,
        num_samples=spec.num_samples,
        num_shards=spec.num_shards,
        seed=spec.seed,
        progress=progress,
    )


def _read_marker(path: str) -> dict | None:
    try:
        with open(os.path.join(path, _MARKER_FILE)) as marker:
            return json.load(marker)
    except (OSError, ValueError):
        return None


def _marker_is_valid(marker: dict | None, spec: WorkloadSpec, path: str) -> bool:
    """A cache hit needs the same spec and every listed shard still present."""
    if marker is None or marker.get("spec") != asdict(spec):
        return False
    return all(os.path.isfile(os.path.join(path, shard)) for shard in marker.get("shards", []))


def _clear_stale_outputs(path: str) -> None:
    """Drop old shards and metadata: a prepared index of other bytes would silently mislead."""
    for stale in glob.glob(os.path.join(path, "parts", "*.tar*")):
        os.remove(stale)
    shutil.rmtree(os.path.join(path, ".nv-meta"), ignore_errors=True)
    marker = os.path.join(path, _MARKER_FILE)
    if os.path.exists(marker):
        os.remove(marker)


def ensure_workload(name: str, root: str = DEFAULT_ROOT, *, progress: bool = True) -> Workload:
    """Return workload ``name`` under ``root``, generating it first unless a valid copy exists.

    The marker file is written last, so an interrupted generation is redone on the next call.
    """
    try:
        spec = WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; choose from {sorted(WORKLOADS)}") from None
    path = os.path.abspath(os.path.join(root, name))
    marker = _read_marker(path)
    if _marker_is_valid(marker, spec, path):
        assert marker is not None
        return Workload(spec, path, marker["shards"], marker["generation_seconds"])

    os.makedirs(path, exist_ok=True)
    _clear_stale_outputs(path)
    if progress:
        print(f"generating workload {name!r} into {path} ...", file=sys.stderr)
    with Timer() as timer:
        shards = _generate(spec, path, progress)
    with open(os.path.join(path, _MARKER_FILE), "w") as marker_file:
        json.dump(
            {"spec": asdict(spec), "shards": shards, "generation_seconds": timer.seconds},
            marker_file,
            indent=2,
        )
    if progress:
        print(f"generated {name!r} in {timer.seconds:.1f} s", file=sys.stderr)
    return Workload(spec, path, shards, timer.seconds)


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------


class Timer:
    """``with Timer() as t: ...`` then ``t.seconds``; monotonic, and readable while running."""

    def __init__(self) -> None:
        self._start = 0.0
        self._end: float | None = None

    def __enter__(self) -> Timer:
        self._start = time.perf_counter()
        self._end = None
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._end = time.perf_counter()

    @property
    def seconds(self) -> float:
        end = self._end if self._end is not None else time.perf_counter()
        return end - self._start


# ----------------------------------------------------------------------------------------------
# Memory
# ----------------------------------------------------------------------------------------------

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _child_pids_by_parent() -> dict[int, list[int]]:
    """Parent pid -> child pids of every process, from /proc/<pid>/stat (slow fallback)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat_file:
                stat = stat_file.read()
        except OSError:
            continue  # exited meanwhile
        # The command name may contain spaces and parentheses; fields resume after the last ')'.
        fields_after_name = stat[stat.rfind(b")") + 2 :].split()
        parent = int(fields_after_name[1])
        children.setdefault(parent, []).append(int(entry))
    return children


def _direct_children(pid: int) -> list[int]:
    """Children of one process from /proc/<pid>/task/*/children: a few reads instead of a scan
    of all of /proc. Raises FileNotFoundError where the kernel lacks CONFIG_PROC_CHILDREN."""
    children = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []  # the process exited meanwhile
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as children_file:
                children.extend(int(child) for child in children_file.read().split())
        except ProcessLookupError:
            continue  # the thread exited meanwhile
    return children


def process_tree(root_pid: int | None = None) -> list[int]:
    """``root_pid`` (default: this process) followed by all its live descendants."""
    root_pid = os.getpid() if root_pid is None else root_pid
    try:
        _direct_children(root_pid)
        children_of: Callable[[int], list[int]] = _direct_children
    except FileNotFoundError:
        by_parent = _child_pids_by_parent()
        children_of = lambda pid: by_parent.get(pid, [])  # noqa: E731
    tree, pending = [], [root_pid]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(children_of(pid))
    return tree


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0


def _pss_bytes(pid: int) -> int:
    """Proportional set size: shared pages split among sharers, so sums over workers are fair."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


@dataclass
class MemorySample:
    rss_main: int
    rss_total: int  # sum over the tree; over-counts pages that forked workers share
    pss_total: int | None  # sum of PSS over the tree, the fair total; None if not sampled
    processes: int


def sample_memory(root_pid: int | None = None, *, with_pss: bool = True) -> MemorySample:
    """One snapshot of the memory of a process and its descendants.

    PSS is optional because reading it walks the page tables of every process (tens of ms per
    GiB mapped, holding the process's mmap lock), which would perturb a benchmark if frequent.
    """
    pids = process_tree(root_pid)
    rss = [_rss_bytes(pid) for pid in pids]
    return MemorySample(
        rss_main=rss[0],
        rss_total=sum(rss),
        pss_total=sum(_pss_bytes(pid) for pid in pids) if with_pss else None,
        processes=len(pids),
    )


def loader_worker_pids(loader) -> list[int]:
    """Process ids of a loader's local worker processes (none without workers, before it iterates,
    or with workers that are not local processes)."""
    pool = getattr(loader._transport.source, "pool", None)
    pid = getattr(pool, "pid", None)
    if pid is None:
        return []
    return [p for p in (pid(worker) for worker in range(pool.num_workers)) if p is not None]


def max_rss_bytes() -> tuple[int, int]:
    """(self, largest waited-for child) high-water RSS from getrusage; survives short peaks
    that a sampling probe can miss, but cannot be summed over concurrently live workers."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return own, children


@dataclass
class PeakMemoryProbe:
    """Samples the memory of this process tree in a background thread and keeps the peaks.

    Workers of a data loader are live children, which getrusage cannot sum, hence sampling
    /proc. RSS is cheap and sampled every ``interval_seconds``; PSS only every
    ``pss_interval_seconds`` (see :func:`sample_memory`), so its peak is a coarser estimate.
    Use as a context manager around the code to measure.
    """

    interval_seconds: float = 0.05
    pss_interval_seconds: float = 1.0
    peak_rss_main: int = 0
    peak_rss_total: int = 0
    peak_pss_total: int = 0
    peak_processes: int = 0
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _last_pss_time: float = field(default=float("-inf"), repr=False)

    def _record(self, *, force_pss: bool = False) -> None:
        now = time.monotonic()
        with_pss = force_pss or now - self._last_pss_time >= self.pss_interval_seconds
        snapshot = sample_memory(with_pss=with_pss)
        if snapshot.pss_total is not None:
            self._last_pss_time = now
            self.peak_pss_total = max(self.peak_pss_total, snapshot.pss_total)
        self.peak_rss_main = max(self.peak_rss_main, snapshot.rss_main)
        self.peak_rss_total = max(self.peak_rss_total, snapshot.rss_total)
        self.peak_processes = max(self.peak_processes, snapshot.processes)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            self._record()

    def __enter__(self) -> PeakMemoryProbe:
        self._stop.clear()
        self._record(force_pss=True)
        self._thread = threading.Thread(target=self._run, name="peak-memory-probe", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._record(force_pss=True)


# ----------------------------------------------------------------------------------------------
# Formatting
# ----------------------------------------------------------------------------------------------


def format_number(value: object) -> str:
    """Readable table cells: thousands separators for big numbers, 3 significant digits else."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:  # NaN
            return "n/a"
        if abs(value) >= 100:  # whole numbers (``.3g`` would print 999.6 as "1e+03")
            return f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured markdown table, numbers right-aligned, ready for docs/benchmarks.md."""
    cells = [[format_number(value).replace("|", "\\|") for value in row] for row in rows]
    numeric = [
        all(isinstance(row[column], int | float) for row in rows if row[column] is not None)
        for column in range(len(headers))
    ]
    widths = [
        max([len(header)] + [len(row[column]) for row in cells])
        for column, header in enumerate(headers)
    ]

    def line(values: Sequence[str]) -> str:
        padded = [
            value.rjust(width) if is_numeric else value.ljust(width)
            for value, width, is_numeric in zip(values, widths, numeric)
        ]
        return "| " + " | ".join(padded) + " |"

    separator = [
        ("-" * (width - 1) + ":") if is_num else "-" * width
        for width, is_num in zip(widths, numeric)
    ]
    return "\n".join([line(headers), line(separator), *(line(row) for row in cells)])


def print_markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    print(markdown_table(headers, rows), flush=True)


def machine_summary() -> str:
    """CPU count and load: results from a busy shared machine must be read as such."""
    one, five, _ = os.getloadavg()
    return f"{os.cpu_count()} CPUs, load average {one:.2f} (1 min) {five:.2f} (5 min)"


def mib(num_bytes: float) -> float:
    return num_bytes / MIB


def megabytes_per_second(num_bytes: float, seconds: float) -> float:
    """Decimal MB/s (10^6), the unit disks and networks are usually quoted in."""
    return num_bytes / 1e6 / seconds if seconds > 0 else float("nan")


def per_second(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("nan")


def replace_section(page: str, title: str, text: str) -> str:
    """``page`` with its ``## title`` section replaced by ``text`` (appended if absent)."""
    section = f"## {title}\n\n{text.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(page):
        return pattern.sub(lambda _: section + "\n", page).rstrip() + "\n"
    return page.rstrip() + "\n\n" + section


def write_docs_section(title: str, text: str) -> None:
    """Replace the ``## title`` section of docs/benchmarks.md with ``text`` (append it if absent):
    a benchmark that owns a section refreshes it with its own numbers."""
    path = os.path.join(_REPO_ROOT, "docs", "benchmarks.md")
    current = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    with open(path, "w") as f:
        f.write(replace_section(current, title, text))
