"""A directory of planned balanced windows that ranks share (``Balance(plan_store=...)``).

Each window is planned once, written as one file and read by every rank and loader worker,
each reading only its own shares. A file holds, for a window of ``steps`` global steps of
``ranks`` ranks starting at global position ``first``:

- a JSON header (the run's digest, ``first``, ``ranks``, ``steps``, the pointer kinds, where the
  arrays lie, digests of the streams' snapshots at the window's start and end);
- ``offsets`` (``steps * ranks + 1`` int64): share ``(step, rank)`` is
  ``members[offsets[step * ranks + rank] : offsets[step * ranks + rank + 1]]``;
- ``rank_costs`` (``steps * ranks`` float64): each share's planned cost;
- ``members``: fixed-size records (position, member, kind, source, index) in the plan's order;
- the streams' snapshots at the window's start and end, one ``marshal`` blob per stream (plain
  data only), decoded only when a snapshot is read (a saved state needs them; planning the next
  window from them needs them once per window planned).

Files live under ``<store>/<run digest>/``: the digest covers everything that decides the plans
(the pipeline's configuration with the datasets, the seed, the batch size, the balance and its cost
function, the number of logical streams, the ranks, the end of the pass, this format's and the
composition's versions), so a run never reads another run's plans; ``run.json`` there holds what
the digest was made from. A file is written to a temporary name and renamed (atomic on POSIX
file systems, NFS and Lustre included), so a reader sees a whole file or none.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import mmap
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from energon.atomic import atomic_write_bytes
from energon.errors import PlanStoreError

Key = tuple  # a pointer key (kind, source, index): energon.pipeline.keys
StreamSnapshot = dict[str, Any]  # a stream's plain snapshot: energon.pipeline.snapshot

MAGIC = b"EBPLAN01"
#: Bump when the file layout changes.
FORMAT_VERSION = 1
#: Bump when :func:`energon.balance.assign.compose_steps` changes the plans it makes.
COMPOSE_VERSION = 1

MEMBER = np.dtype(
    [("position", "<i8"), ("member", "<i4"), ("kind", "<i4"), ("source", "<i4"), ("index", "<i8")]
)
_HEADER_LENGTH = struct.Struct("<Q")


def run_digest(config: dict[str, Any], ranks: int, end: int | None) -> tuple[str, dict[str, Any]]:
    """(digest, what it was made from) of a run's plans: ``config`` is the pipeline's
    ``PipelineSpec.config()`` (datasets, seed, batch size, balance and cost function, streams)."""
    run = {
        "pipeline": config,
        "ranks": ranks,
        "end": end,
        "format": FORMAT_VERSION,
        "compose": COMPOSE_VERSION,
    }
    return _digest(run), run


def snapshots_digest(snapshots: Mapping[int, StreamSnapshot]) -> str:
    """A digest of the streams' snapshots of the pointer stages (no error counts: those are each
    rank's own): consecutive windows must chain (one's end is the next one's start)."""
    return _digest([[s, snapshots[s]] for s in sorted(snapshots)])


def _digest(plain: Any) -> str:
    text = json.dumps(plain, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class PlanStore:
    """The directory of one run's planned windows (``<root>/<digest>``)."""

    def __init__(
        self, root: str | os.PathLike, config: dict[str, Any], ranks: int, end: int | None
    ):
        self.digest, self.run = run_digest(config, ranks, end)
        self.directory = Path(root) / self.digest
        self.ranks = ranks

    def path(self, first: int) -> Path:
        return self.directory / f"window-{first:015d}.plan"

    def has(self, first: int) -> bool:
        return self.path(first).exists()

    def write(
        self,
        first: int,
        kinds: Sequence[str],
        shares: Sequence[Sequence[Sequence[tuple[int, int, Key]]]],
        rank_costs: Sequence[Sequence[float]],
        start: Mapping[int, StreamSnapshot],
        end: Mapping[int, StreamSnapshot],
    ) -> Path:
        """Publish a planned window: ``shares[step][rank]`` lists the share's (position, member,
        pointer key) in order, ``rank_costs[step][rank]`` its cost. Atomic (temporary + rename)."""
        self._write_run()
        members, offsets = _member_records(kinds, shares)
        costs = np.asarray([c for step in rank_costs for c in step], dtype="<f8")
        if sorted(start) != list(range(len(start))) or sorted(end) != sorted(start):
            raise ValueError("a window's snapshots are of streams 0 ... n - 1, at start and end")
        blobs = [marshal.dumps(start[s]) for s in range(len(start))]
        blobs += [marshal.dumps(end[s]) for s in range(len(end))]
        blob_offsets = np.cumsum([0] + [len(b) for b in blobs], dtype=np.int64)
        arrays = {"offsets": offsets, "rank_costs": costs, "members": members}
        arrays["snapshot_offsets"] = blob_offsets
        header = {
            "digest": self.digest,
            "first": first,
            "ranks": self.ranks,
            "steps": len(shares),
            "kinds": list(kinds),
            "streams": len(start),
            "start_digest": snapshots_digest(start),
            "end_digest": snapshots_digest(end),
        }
        return _publish(self.path(first), header, arrays, b"".join(blobs))

    def read(self, first: int) -> StoredWindow | None:
        """The window starting at global position ``first``, or None while none is published."""
        try:
            window = open_window(self.path(first))
        except FileNotFoundError:
            return None
        if window.header["digest"] != self.digest or window.header["first"] != first:
            raise PlanStoreError(
                f"balance plan store: {self.path(first)} holds window "
                f"{window.header['first']} of run {window.header['digest']}, not window {first} "
                f"of run {self.digest} (a file copied or renamed by hand?)"
            )
        return window

    def _write_run(self) -> None:
        run_file = self.directory / "run.json"
        if run_file.exists():
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(run_file, json.dumps(self.run, indent=1, default=str).encode())


def open_window(path: Path) -> StoredWindow:
    """The window published at ``path``, memory-mapped (FileNotFoundError while there is none)."""
    with open(path, "rb") as f:
        return StoredWindow(path, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


class StoredWindow:
    """A published window, memory-mapped: a rank reads its shares and the steps' costs."""

    def __init__(self, path: Path, data: mmap.mmap) -> None:
        self.path = path
        try:
            if data[: len(MAGIC)] != MAGIC:
                raise ValueError("not a balance plan file")
            (length,) = _HEADER_LENGTH.unpack_from(data, len(MAGIC))
            at = len(MAGIC) + _HEADER_LENGTH.size
            self.header: dict[str, Any] = json.loads(bytes(data[at : at + length]))
            self._arrays = {
                name: np.frombuffer(data, dtype=_dtype(dtype), count=count, offset=offset)
                for name, (dtype, count, offset) in self.header["arrays"].items()
            }
        except (ValueError, KeyError, TypeError, struct.error) as e:
            raise PlanStoreError(f"balance plan store: {path} is damaged ({e})") from e
        self.first: int = self.header["first"]
        self.ranks: int = self.header["ranks"]
        self.steps: int = self.header["steps"]
        self._kinds: list[str] = self.header["kinds"]
        blobs = (data, self.header["blobs_at"], self._arrays["snapshot_offsets"])
        streams = self.header["streams"]
        self.start = StoredSnapshots(blobs, streams, 0, path)
        self.end = StoredSnapshots(blobs, streams, streams, path)

    def share(self, step: int, rank: int) -> list[tuple[int, int, Key]]:
        """(position, member, pointer key) of each sample of ``rank``'s share of ``step``."""
        at = step * self.ranks + rank
        lo, hi = self._arrays["offsets"][at : at + 2].tolist()
        rows = self._arrays["members"][lo:hi].tolist()
        kinds = self._kinds
        return [(p, m, (kinds[k], s, i)) for p, m, k, s, i in rows]

    def rank_costs(self, step: int) -> StepCosts:
        return StepCosts(self._arrays["rank_costs"][step * self.ranks : (step + 1) * self.ranks])


class StepCosts(Sequence[float]):
    """Every rank's planned cost of a step, read from the stored window only when used: a rank
    needs its own cost per step, while the list of all ``ranks`` costs (``BalancedBatch.step_costs``)
    is read only by whoever looks at it. Compares equal to a list of the same floats."""

    __slots__ = ("_costs",)

    def __init__(self, costs: np.ndarray | Sequence[float]) -> None:
        self._costs = np.asarray(costs, dtype="<f8")

    def __len__(self) -> int:
        return len(self._costs)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return self._costs[index].tolist()
        return float(self._costs[index])

    def __iter__(self) -> Iterator[float]:
        return iter(self._costs.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (StepCosts, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return repr(list(self))

    def __reduce__(self) -> tuple:
        return StepCosts, (self._costs.copy(),)  # a copy: the stored window is not sent


class StoredSnapshots(Mapping[int, StreamSnapshot]):
    """The streams' snapshots of a stored window, each decoded on first use."""

    def __init__(
        self, blobs: tuple[mmap.mmap, int, np.ndarray], streams: int, skip: int, path: Path
    ):
        self._data, self._base, self._offsets = blobs
        self._streams, self._skip = streams, skip
        self._decoded: dict[int, StreamSnapshot] = {}
        self.path = path
        self.at_end = skip > 0  # the window's end snapshots (else its start)

    def __getitem__(self, stream: int) -> StreamSnapshot:
        snapshot = self._decoded.get(stream)
        if snapshot is None:
            snapshot = self._decoded[stream] = marshal.loads(self.blob(stream))
        return snapshot

    def blob(self, stream: int) -> bytes:
        """Stream ``stream``'s snapshot as written (``marshal``), not decoded."""
        if not 0 <= stream < self._streams:
            raise KeyError(stream)
        slot = self._skip + stream
        lo, hi = (self._base + int(o) for o in self._offsets[slot : slot + 2])
        return self._data[lo:hi]

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._streams))

    def __len__(self) -> int:
        return self._streams


def _member_records(
    kinds: Sequence[str], shares: Sequence[Sequence[Sequence[tuple[int, int, Key]]]]
) -> tuple[np.ndarray, np.ndarray]:
    """The shares as fixed-size member records and the offsets of each share among them."""
    kind_ids = {kind: i for i, kind in enumerate(kinds)}
    rows = [
        (position, member, kind_ids[key[0]], key[1], key[2])
        for step in shares
        for share in step
        for position, member, key in share
    ]
    sizes = [len(share) for step in shares for share in step]
    offsets = np.cumsum([0] + sizes, dtype=np.int64)
    return np.array(rows, dtype=MEMBER), offsets


def _publish(path: Path, header: dict[str, Any], arrays: dict[str, np.ndarray], blobs: bytes):
    """Lay out header, arrays (8-byte aligned) and blobs in one file, written atomically."""
    layout: dict[str, list[Any]] = {}
    header = dict(header, arrays=layout, blobs_at=0)
    # the header's own length depends on the offsets it lists: lay out twice with a fixed width
    for _ in range(2):
        text = json.dumps(header, separators=(",", ":")).encode()
        at = _aligned(len(MAGIC) + _HEADER_LENGTH.size + len(text) + 64)
        for name, array in arrays.items():
            layout[name] = [
                array.dtype.descr if array.dtype.names else array.dtype.str,
                len(array),
                at,
            ]
            at = _aligned(at + array.nbytes)
        header["blobs_at"] = at
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(MAGIC) + _HEADER_LENGTH.size + len(text) <= min(v[2] for v in layout.values())
    body = bytearray(at + len(blobs))
    body[: len(MAGIC)] = MAGIC
    _HEADER_LENGTH.pack_into(body, len(MAGIC), len(text))
    body[len(MAGIC) + _HEADER_LENGTH.size : len(MAGIC) + _HEADER_LENGTH.size + len(text)] = text
    for name, array in arrays.items():
        offset = layout[name][2]
        body[offset : offset + array.nbytes] = array.tobytes()
    body[at:] = blobs
    atomic_write_bytes(path, bytes(body))
    return path


def _dtype(described: str | list[list[str]]) -> np.dtype:
    """A dtype from its JSON form (a string, or a record's ``[[name, format], ...]``)."""
    return np.dtype(described if isinstance(described, str) else [tuple(f) for f in described])


def _aligned(offset: int) -> int:
    return (offset + 7) // 8 * 8
