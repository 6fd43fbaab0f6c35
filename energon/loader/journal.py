"""The loader's journal: the restore key of every micro-batch a rank delivered.

Hooks that decide from decoded data (an ``encode_sample`` that skips or multiplies samples, a
packer or grouper that looks at tokens or pixels) cannot be replayed from metadata. The restore key
a loader attaches to each micro-batch already names every sample in it, output by output, so after
``loader.start_journal(DIR)`` a loader appends each delivered batch's position and key there; the
ledger reads past steps from it (exactly what was delivered) and simulates the rest.

Layout, per rank and per source numbering (a migration renumbers sources, so it starts new files):
``rank<r>-<sources>.pos`` (int64 positions), ``.off`` (int64 byte offsets) and ``.keys`` (one JSON
line per batch: the ``__restore_key__``). ``<sources>`` is a digest of the sources' identities in
order. Files are appended to; a position delivered twice (a restart from an earlier state) keeps
its latest record. Records are flushed whenever the loader saves its state, so every batch before a
checkpoint is in the journal. Size: about 25 bytes per sample plus 16 per batch.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from typing import Any

import numpy as np

from energon.errors import ArgumentError
from energon.pipeline.keys import Key, parse_stream_key
from energon.pipeline.spec import PipelineSpec


def sources_digest(fingerprint: dict[str, Any]) -> str:
    """What the journal's source numbers mean: the sources of a config fingerprint, in order."""
    datasets = [
        [d.get("path"), d.get("split_part"), d.get("range")] for d in fingerprint["datasets"]
    ]
    text = json.dumps(datasets, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class JournalWriter:
    """Appends one rank's delivered micro-batches (opened lazily, flushed on :meth:`flush`)."""

    def __init__(self, directory: str, rank: int, digest: str) -> None:
        self.base = os.path.join(directory, f"rank{rank:05d}-{digest}")
        self.directory = directory
        self.digest = digest
        self._files: tuple[Any, Any, Any] | None = None

    def _open(self) -> tuple[Any, Any, Any]:
        if self._files is None:
            os.makedirs(self.directory, exist_ok=True)
            self._files = (
                open(self.base + ".pos", "ab"),
                open(self.base + ".off", "ab"),
                open(self.base + ".keys", "ab"),
            )
        return self._files

    def append(self, position: int, key: Key) -> None:
        positions, offsets, keys = self._open()
        offset = keys.seek(0, os.SEEK_END)
        keys.write(json.dumps(key, separators=(",", ":")).encode() + b"\n")
        offsets.write(np.int64(offset).tobytes())
        positions.write(np.int64(position).tobytes())

    def flush(self) -> None:
        if self._files is not None:
            # keys first: a record's position is only visible once its key is on disk
            for f in (self._files[2], self._files[1], self._files[0]):
                f.flush()

    def close(self) -> None:
        if self._files is not None:
            self.flush()
            for f in self._files:
                f.close()
            self._files = None


class LoaderJournal:
    """The journal of one loader (``loader.start_journal(directory)``): the rank's writer under
    the current source numbering. A restore or a migration may change the numbering; the next
    record then goes to the files of the new one."""

    def __init__(self, directory: str, rank: int) -> None:
        self.directory = directory
        self.rank = rank
        self._writer: JournalWriter | None = None
        self._spec: PipelineSpec | None = None  # the spec the writer's digest was taken from

    def append(self, spec: PipelineSpec, position: int, key: Key) -> None:
        """Record the micro-batch at global ``position``, delivered under ``spec``."""
        self._writer_for(spec).append(position, key)

    def _writer_for(self, spec: PipelineSpec) -> JournalWriter:
        writer = self._writer
        if writer is None or self._spec is not spec:
            digest = sources_digest(spec.fingerprint())
            if writer is None or writer.digest != digest:
                if writer is not None:
                    writer.close()
                writer = self._writer = JournalWriter(self.directory, self.rank, digest)
            self._spec = spec
        return writer

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class JournalReader:
    """Looks up delivered micro-batches by global position in a journal directory."""

    def __init__(self, directory: str, digest: str | None = None) -> None:
        if not os.path.isdir(directory):
            raise ArgumentError(
                "journal", f"{directory} is not a folder (expected the loader's journal folder)"
            )
        self.directory = directory
        self.digest = digest
        self._index: list[tuple[np.ndarray, np.ndarray, np.ndarray, str]] | None = None

    def use_digest(self, digest: str) -> None:
        """Read only the files of this source numbering."""
        if digest != self.digest:
            self.digest, self._index = digest, None

    def _files(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, str]]:
        if self._index is None:
            pattern = f"rank*-{self.digest or '*'}.pos"
            index = []
            for pos_path in sorted(glob.glob(os.path.join(self.directory, pattern))):
                base = pos_path[: -len(".pos")]
                positions = _int64s(pos_path)
                offsets = _int64s(base + ".off")
                n = min(len(positions), len(offsets))  # a record being written is not visible
                positions, offsets = positions[:n], offsets[:n]
                order = np.argsort(positions, kind="stable")
                index.append((positions[order], offsets[order], order, base + ".keys"))
            self._index = index
        return self._index

    def lookup(self, position: int) -> tuple[int, int, Key] | None:
        """The delivered micro-batch at ``position``: (stream, item, key in the stream)."""
        best: tuple[int, int, str] | None = None  # (file order, offset, path)
        for positions, offsets, order, path in self._files():
            hi = int(np.searchsorted(positions, position, side="right"))
            if hi and positions[hi - 1] == position:
                best = (int(order[hi - 1]), int(offsets[hi - 1]), path)
        if best is None:
            return None
        with open(best[2], "rb") as f:
            f.seek(best[1])
            return parse_stream_key(json.loads(f.readline()))

    def positions(self) -> np.ndarray:
        """Every position recorded (sorted, unique)."""
        found = [positions for positions, _, _, _ in self._files()]
        return np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)


def _int64s(path: str) -> np.ndarray:
    if not os.path.exists(path) or os.path.getsize(path) < 8:
        return np.zeros(0, dtype=np.int64)
    return np.fromfile(path, dtype=np.int64, count=os.path.getsize(path) // 8)
