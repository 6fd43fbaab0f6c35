"""Remote shard bytes fetched ahead of need, in few large ranged reads, within a memory budget.

Why: one GET per sample costs a round trip per sample, and a synchronous GET per block still makes the
reader wait for every block. The plan knows which samples a stream reads next (the slices it is about
to open), so the reader hints those sample ranges here; this module coalesces the hinted samples of a
shard into chunks (consecutive samples, up to ``CHUNK_BYTES``) and fetches them on background
threads. A read then finds its bytes in a chunk that is ready or on its way.

Chunks always start and end on sample boundaries (taken from the tar index), so a sample is never
split between two chunks, and chunks of one shard never overlap. Reads that no hint covered (joins,
auxiliary data, a restore) fetch an on-demand chunk of up to ``ON_DEMAND_BYTES`` from the sample on,
which serves the neighbouring samples read next.

Memory: the bytes of cached and in-flight chunks stay within ``budget``. A hint that does not fit is
dropped (the reads it would have served fetch on demand); on-demand chunks evict the least recently
used chunks. A chunk is never evicted while a hint's bytes in it have not been read yet, unless an
on-demand read needs the room.

Settings (environment, per process): ``ENERGON_REMOTE_PREFETCH_BUDGET`` (bytes, default 256 MiB),
``ENERGON_REMOTE_PREFETCH_THREADS`` (default 8), ``ENERGON_REMOTE_CHUNK_BYTES`` (the largest
hinted chunk, default 1 MiB), ``ENERGON_REMOTE_READAHEAD_BYTES`` (the on-demand chunk size, default
1 MiB); ``ENERGON_REMOTE_PREFETCH_BUDGET=0`` turns hints off.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeoutError

import numpy as np

from energon import epath
from energon.remote.stats import STATS

CHUNK_BYTES = int(os.environ.get("ENERGON_REMOTE_CHUNK_BYTES", 1 << 20))
FETCHER_IDLE_S = 10.0  # a fetch thread without work for this long exits
HEDGE_MIN_S = float(os.environ.get("ENERGON_REMOTE_HEDGE_AFTER", 2.0))
ON_DEMAND_BYTES = int(os.environ.get("ENERGON_REMOTE_READAHEAD_BYTES", 1 << 20))
PREFETCH_BUDGET = int(os.environ.get("ENERGON_REMOTE_PREFETCH_BUDGET", 256 << 20))
PREFETCH_THREADS = int(os.environ.get("ENERGON_REMOTE_PREFETCH_THREADS", 8))


class _Chunk:
    """Bytes ``[start, end)`` of one shard: ready, or a future that will hold them."""

    __slots__ = ("path", "start", "end", "future", "hinted", "started")

    def __init__(self, path: str, start: int, end: int, future: Future, hinted: bool) -> None:
        self.path = path
        self.start = start
        self.end = end
        self.future = future
        self.hinted = hinted  # fetched for a hint and not read yet: keep it until it is read
        self.started = False  # a fetch thread or a waiting reader has taken it

    @property
    def size(self) -> int:
        return self.end - self.start


def _fetch(chunk: _Chunk, report_errors: bool = True) -> float:
    """Fill a chunk's future with its bytes, or with the error that stopped them (a hedge leaves
    errors to the first request); whichever request answers first wins. Returns the seconds the
    request took."""
    began = time.perf_counter()
    try:
        data = epath.read_range(chunk.path, chunk.start, chunk.end)
    except BaseException as e:
        if report_errors:
            with contextlib.suppress(InvalidStateError):
                chunk.future.set_exception(e)
        return time.perf_counter() - began
    with contextlib.suppress(InvalidStateError):
        chunk.future.set_result(data)
    return time.perf_counter() - began


class RemoteChunkCache:
    """Chunks of remote shards by (path, start); one per process (it owns threads).

    Hinted chunks wait in a priority queue for the fetch threads: the k-th piece of every hint
    before the (k+1)-th piece of any, oldest hint first. A stream reads its open slices side by
    side, so it needs the first piece of each of them before the second piece of any; fetching in
    that order gets the first batch (and every slice that opens later) going early instead of
    downloading whole slices one after the other.
    """

    def __init__(
        self,
        budget: int = PREFETCH_BUDGET,
        threads: int = PREFETCH_THREADS,
        hedge_min_s: float = HEDGE_MIN_S,
    ) -> None:
        self.budget = budget
        self.threads = max(0, threads)  # 0: hinted chunks are fetched by the reads that need them
        self.hedge_min_s = hedge_min_s
        self._typical_fetch_s = 0.0
        self._starts: dict[str, list[int]] = {}
        self._chunks: OrderedDict[tuple[str, int], _Chunk] = OrderedDict()  # LRU order
        self._bytes = 0
        self._lock = threading.Lock()
        # heap of (piece rank, hint number, chunk or deferred hint)
        self._queue: list[tuple[int, int, _Chunk | Callable[[], None]]] = []
        self._queued = threading.Condition(self._lock)
        self._hints = 0
        self._fetchers = 0  # live fetch threads
        self._idle = 0  # of which waiting for work

    # -- hints -----------------------------------------------------------------------------

    def prefetch(self, path: str, offsets: np.ndarray, later: bool = False) -> None:
        """Fetch the samples whose boundaries are ``offsets`` (sample starts plus the final end) in
        the background, skipping samples already cached; drops what does not fit the budget.
        ``later`` ranges (slices not open yet) queue one rank behind the others."""
        if self.budget <= 0 or len(offsets) < 2:
            return
        with self._lock:
            self._hints += 1
            pieces = self._uncovered_pieces(path, offsets)
            for rank, (start, end) in enumerate(pieces, start=int(later)):
                if not self._make_room(end - start, hinted_only=True):
                    return
                chunk = self._add(path, start, end, hinted=True)
                heapq.heappush(self._queue, (rank, self._hints, chunk))
                self._wake_fetcher()

    def _wake_fetcher(self) -> None:
        """Hand the queue to an idle fetch thread, or start one (up to ``threads``)."""
        if self._idle:
            self._queued.notify()
        elif self._fetchers < self.threads:
            self._fetchers += 1
            threading.Thread(target=self._fetch_loop, name="energon-prefetch", daemon=True).start()

    def _fetch_loop(self) -> None:
        """Fetch queued chunks, best priority first; exit after a while without work."""
        while True:
            with self._lock:
                while not self._queue:
                    self._idle += 1
                    woken = self._queued.wait(timeout=FETCHER_IDLE_S)
                    self._idle -= 1
                    if not woken and not self._queue:
                        self._fetchers -= 1
                        return
                _, _, item = heapq.heappop(self._queue)
                if isinstance(item, _Chunk):
                    if item.started:
                        continue  # a reader that needed it took it
                    item.started = True
            if isinstance(item, _Chunk):
                self._observe(_fetch(item))
            else:
                try:
                    item()
                except Exception:
                    pass  # a failed hint costs nothing: the read that needs the bytes reports it

    def defer(self, hint: Callable[[], None]) -> None:
        """Run ``hint`` on a fetch thread before any queued chunk (e.g. a hint that first needs
        a shard's index downloaded: the caller does not wait for it)."""
        with self._lock:
            self._hints += 1
            heapq.heappush(self._queue, (-1, self._hints, hint))
            self._wake_fetcher()

    def _uncovered_pieces(self, path: str, offsets: np.ndarray) -> list[tuple[int, int]]:
        """Runs of consecutive samples not in any chunk, cut into pieces of at most CHUNK_BYTES
        (a single larger sample makes its own piece). A range larger than CHUNK_BYTES starts with
        a quarter-size piece and doubles from there, so that its first samples (needed first)
        arrive sooner."""
        pieces: list[tuple[int, int]] = []
        piece_start = None
        bounds = [int(o) for o in offsets]
        size = CHUNK_BYTES // 4 if bounds[-1] - bounds[0] > CHUNK_BYTES else CHUNK_BYTES
        for s, e in zip(bounds[:-1], bounds[1:]):
            if self._find(path, s, e) is not None or self._overlaps(path, s, e):
                if piece_start is not None:
                    pieces.append((piece_start, s))
                    piece_start = None
                continue
            if piece_start is None:
                piece_start = s
            elif e - piece_start > size:
                pieces.append((piece_start, s))
                piece_start = s
                size = min(CHUNK_BYTES, 2 * size)
        if piece_start is not None:
            pieces.append((piece_start, bounds[-1]))
        return pieces

    # -- reads -----------------------------------------------------------------------------

    def read(self, path: str, start: int, end: int, offsets: np.ndarray | None) -> bytes:
        """Bytes ``[start, end)`` of a record of ``path``; ``offsets`` are the file's record
        boundaries. Without them an unhinted read fetches exactly its range (random access)."""
        with self._lock:
            chunk = self._find(path, start, end)
            if chunk is None and not self._overlaps(path, start, end):
                chunk = self._on_demand(path, start, end, offsets)  # we fetch it
            if chunk is not None:
                self._chunks.move_to_end((path, chunk.start))
                chunk.hinted = False
        if chunk is None:  # straddles cached chunks (only for reads inside samples): read directly
            return epath.read_range(path, start, end)
        try:
            if chunk.future.done():
                data = chunk.future.result()
            else:  # the loader waits for remote bytes: count it (prefetch did not keep up)
                waited = time.perf_counter()
                self._wait_for(chunk)
                data = chunk.future.result()  # a failed fetch raises here, for the sample
                STATS.add(wait_seconds=time.perf_counter() - waited)
        except BaseException:
            with self._lock:  # forget it, so that a later read tries again
                if self._chunks.get((path, chunk.start)) is chunk:
                    self._remove(chunk)
            raise
        return data[start - chunk.start : end - chunk.start]

    def _wait_for(self, chunk: _Chunk) -> None:
        """Until the chunk's future is done. A chunk still queued is fetched in this thread at
        once (it is needed now, whatever its place in the queue); a request in flight for longer
        than ``hedge_after()`` gets a second, hedged request, and the first answer wins."""
        with self._lock:
            mine = not chunk.started
            chunk.started = True
        if mine:
            self._observe(_fetch(chunk))
            return
        try:
            chunk.future.result(timeout=self.hedge_after())
            return
        except FutureTimeoutError:
            pass
        except BaseException:
            return  # failed: the caller raises it
        STATS.add(hedged=1)
        # on its own thread, so that the first request still wins if it answers first; a failed
        # hedge reports nothing: the first request decides then
        threading.Thread(target=_fetch, args=(chunk, False), daemon=True).start()
        chunk.future.exception()  # wait for whichever request answers

    def hedge_after(self) -> float | None:
        """Seconds before a slow request is hedged: four times the typical fetch time, at least
        ``hedge_min_s``; None when hedging is off."""
        if self.hedge_min_s <= 0:
            return None
        return max(self.hedge_min_s, 4 * self._typical_fetch_s)

    def _observe(self, seconds: float) -> None:
        """Track the typical fetch time (moving average) that sets the hedging delay."""
        self._typical_fetch_s += 0.1 * (seconds - self._typical_fetch_s)

    def _on_demand(self, path: str, start: int, end: int, offsets: np.ndarray | None) -> _Chunk:
        """A chunk from ``start`` to the last record boundary within ON_DEMAND_BYTES, stopping
        before the next cached chunk (so chunks never overlap); exactly the range without
        ``offsets``."""
        if offsets is None:
            self._make_room(end - start, hinted_only=False)
            return self._add(path, start, end, hinted=False)
        limit = start + max(ON_DEMAND_BYTES, end - start)
        starts = self._starts.get(path, [])
        i = bisect.bisect_right(starts, start)
        if i < len(starts):
            limit = min(limit, starts[i])
        last = int(np.searchsorted(offsets, limit, side="right")) - 1
        chunk_end = max(end, int(offsets[last]))
        self._make_room(chunk_end - start, hinted_only=False)
        return self._add(path, start, chunk_end, hinted=False)

    # -- bookkeeping (callers hold the lock) -----------------------------------------------

    def _find(self, path: str, start: int, end: int) -> _Chunk | None:
        starts = self._starts.get(path)
        if not starts:
            return None
        i = bisect.bisect_right(starts, start) - 1
        if i < 0:
            return None
        chunk = self._chunks[(path, starts[i])]
        return chunk if end <= chunk.end else None

    def _overlaps(self, path: str, start: int, end: int) -> bool:
        starts = self._starts.get(path)
        if not starts:
            return False
        i = bisect.bisect_right(starts, start) - 1
        if i >= 0 and self._chunks[(path, starts[i])].end > start:
            return True
        return i + 1 < len(starts) and starts[i + 1] < end

    def _add(self, path: str, start: int, end: int, hinted: bool) -> _Chunk:
        chunk = _Chunk(path, start, end, Future(), hinted)
        self._chunks[(path, start)] = chunk
        bisect.insort(self._starts.setdefault(path, []), start)
        self._bytes += chunk.size
        return chunk

    def _make_room(self, size: int, hinted_only: bool) -> bool:
        """Evict least recently used chunks until ``size`` more bytes fit. Hints evict only chunks
        that were read already; on-demand reads may evict anything (and always proceed)."""
        if self._bytes + size <= self.budget:
            return True
        for key in list(self._chunks):
            if self._bytes + size <= self.budget:
                return True
            chunk = self._chunks[key]
            if hinted_only and (chunk.hinted or not chunk.future.done()):
                continue
            self._remove(chunk)
        return self._bytes + size <= self.budget

    def _remove(self, chunk: _Chunk) -> None:
        del self._chunks[(chunk.path, chunk.start)]
        starts = self._starts[chunk.path]
        del starts[bisect.bisect_left(starts, chunk.start)]
        self._bytes -= chunk.size
