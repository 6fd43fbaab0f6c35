"""Megatron's indexed token format (``<prefix>.bin`` + ``<prefix>.idx``, the "MMIDIDX" format).

The ``.bin`` file is the raw concatenation of every sequence's token ids (one dtype, little-endian, no
header). The ``.idx`` file describes it (all little-endian)::

    magic b"MMIDIDX\\x00\\x00" | u64 version=1 | u8 dtype code | u64 N sequences | u64 D document-index length
    int32[N] sequence lengths | int64[N] byte offsets into .bin | int64[D] document index | int8[N] modes (optional)

Files written here are byte-identical to megatron-core's ``IndexedDatasetBuilder``, and files written
by megatron-core read here. Readers memory-map lazily: constructing an ``IndexedTokens`` reads nothing,
so start-up at scale pays only for the prefixes a process really touches, and the object pickles into
DataLoader workers as a few paths and numbers.
"""

from __future__ import annotations

import mmap
import os
import shutil
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from energon import atomic, epath
from energon.errors import IndexedFormatError
from energon.remote import RemoteNotFoundError

RangeReader = Callable[[str, int, int], bytes]  # (url, start, end) -> bytes [start, end) of url

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
HEADER_SIZE = len(INDEX_MAGIC) + 8 + 1 + 8 + 8  # = 34: the arrays start here

# megatron-core's DType codes (indexed_dataset.DType): code <-> numpy dtype.
DTYPE_BY_CODE: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}
CODE_BY_DTYPE: dict[np.dtype, int] = {dt: code for code, dt in DTYPE_BY_CODE.items()}


def optimal_dtype(vocab_size: int | None) -> np.dtype:
    """The token dtype megatron's preprocessing picks: uint16 if the vocabulary fits, else int32."""
    if vocab_size is not None and vocab_size < 65500:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


def dtype_from_code(code: int, *, where: str = "") -> np.dtype:
    try:
        return DTYPE_BY_CODE[code]
    except KeyError:
        raise IndexedFormatError(
            f"{where}: unknown dtype code {code} (valid: {sorted(DTYPE_BY_CODE)})"
        ) from None


def code_from_dtype(dtype: Any) -> int:
    dt = np.dtype(dtype)
    if dt not in CODE_BY_DTYPE:
        raise IndexedFormatError(
            f"dtype {dt} cannot be stored in a Megatron index (allowed: "
            f"{sorted(str(d) for d in CODE_BY_DTYPE)})"
        )
    return CODE_BY_DTYPE[dt]


def bin_path(prefix: str | os.PathLike) -> str:
    return os.fspath(prefix) + ".bin"


def idx_path(prefix: str | os.PathLike) -> str:
    return os.fspath(prefix) + ".idx"


def write_index_file(
    path: str,
    dtype: Any,
    sequence_lengths: np.ndarray,
    document_indices: np.ndarray,
    modes: np.ndarray | None = None,
) -> None:
    """Write an ``.idx`` file (through a temporary file, so a crash leaves no half-written index)."""
    lengths = np.asarray(sequence_lengths, dtype=np.int32)
    docs = np.asarray(document_indices, dtype=np.int64)
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * itemsize, out=pointers[1:])
    with atomic.replacing(path) as tmp, open(tmp, "wb") as f:
        f.write(INDEX_MAGIC)
        f.write(struct.pack("<Q", INDEX_VERSION))
        f.write(struct.pack("<B", code_from_dtype(dtype)))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(docs)))
        f.write(lengths.astype("<i4").tobytes(order="C"))
        f.write(pointers.astype("<i8").tobytes(order="C"))
        f.write(docs.astype("<i8").tobytes(order="C"))
        if modes is not None:
            f.write(np.asarray(modes, dtype=np.int8).tobytes(order="C"))


class TokenFileWriter:
    """Writes a ``.bin``/``.idx`` pair the way megatron-core's ``IndexedDatasetBuilder`` does.

    ``add_item`` appends one sequence, ``end_document`` closes the current document, ``add_document``
    does both for a list of sequences, ``add_index`` appends a whole existing prefix, and
    ``finalize`` writes the ``.idx``. Lengths and document boundaries are kept as compact integer
    arrays, not per-token Python objects.
    """

    def __init__(self, prefix: str | os.PathLike, dtype: Any = np.int32, multimodal: bool = False):
        self.prefix = os.fspath(prefix)
        self.dtype = np.dtype(dtype)
        code_from_dtype(self.dtype)  # reject unsupported dtypes before writing anything
        self.multimodal = multimodal
        self._bin = open(bin_path(self.prefix), "wb")
        self._lengths: list[np.ndarray] = []
        self._pending_lengths: list[int] = []
        self._modes: list[np.ndarray] = []
        self._pending_modes: list[int] = []
        self._documents: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]
        self._pending_documents: list[int] = []
        self._num_sequences = 0

    def add_item(self, tokens: Any, mode: int = 0) -> None:
        """Append one sequence (any 1-D array-like or tensor of token ids)."""
        array = np.asarray(_as_numpy(tokens), dtype=self.dtype).reshape(-1)
        self._bin.write(array.tobytes(order="C"))
        self._pending_lengths.append(array.size)
        if self.multimodal:
            self._pending_modes.append(mode)
        self._num_sequences += 1

    def end_document(self) -> None:
        """Close the current document (an empty document is legal: its boundary repeats)."""
        self._pending_documents.append(self._num_sequences)

    def add_document(
        self, sequences: Sequence[Any] | Any, lengths: Sequence[int] | None = None
    ) -> None:
        """Append one document: either a list of sequences, or one flat array cut by ``lengths``."""
        if lengths is None:
            for seq in sequences:
                self.add_item(seq)
        else:
            flat = np.asarray(_as_numpy(sequences), dtype=self.dtype).reshape(-1)
            offsets = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])
            for lo, hi in zip(offsets[:-1], offsets[1:]):
                self.add_item(flat[lo:hi])
        self.end_document()

    def add_index(self, prefix: str | os.PathLike) -> None:
        """Append every sequence and document of an existing prefix (the merge operation)."""
        other = IndexedTokens(prefix)
        if other.dtype != self.dtype:
            raise IndexedFormatError(
                f"{idx_path(prefix)}: dtype {other.dtype} differs from the output's {self.dtype}"
            )
        if self.multimodal and other.modes is None:
            raise IndexedFormatError(f"{idx_path(prefix)}: has no sequence modes (not multimodal)")
        self._flush_pending()
        self._lengths.append(np.array(other.sequence_lengths, dtype=np.int32))
        if self.multimodal:
            self._modes.append(np.array(other.modes, dtype=np.int8))
        self._documents.append(np.asarray(other.document_indices[1:]) + self._num_sequences)
        self._num_sequences += len(other)
        self._bin.flush()
        with open(bin_path(prefix), "rb") as src:
            shutil.copyfileobj(src, self._bin, length=16 << 20)

    def finalize(self) -> None:
        """Close the ``.bin`` and write the ``.idx``."""
        self._flush_pending()
        self._bin.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int32)
        modes = None
        if self.multimodal:
            modes = np.concatenate(self._modes) if self._modes else np.zeros(0, np.int8)
        write_index_file(
            idx_path(self.prefix), self.dtype, lengths, np.concatenate(self._documents), modes
        )

    def _flush_pending(self) -> None:
        if self._pending_lengths:
            self._lengths.append(np.asarray(self._pending_lengths, dtype=np.int32))
            self._pending_lengths = []
        if self._pending_modes:
            self._modes.append(np.asarray(self._pending_modes, dtype=np.int8))
            self._pending_modes = []
        if self._pending_documents:
            self._documents.append(np.asarray(self._pending_documents, dtype=np.int64))
            self._pending_documents = []

    def __enter__(self) -> TokenFileWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.finalize()
        else:
            self._bin.close()


def _as_numpy(tokens: Any) -> Any:
    """Tensors become numpy arrays without importing torch here."""
    numpy_fn = getattr(tokens, "numpy", None)
    if callable(numpy_fn) and not isinstance(tokens, np.ndarray):
        return numpy_fn()
    return tokens


class IndexedTokens:
    """A memory-mapped, lazily opened ``.bin``/``.idx`` pair.

    Nothing is read at construction. ``num_sequences`` and ``dtype`` can be given (from a
    ``build-sequences`` JSON file) so that even the header is never read; the ``.idx`` arrays are
    memory-mapped on first access and validated against the file sizes then.
    """

    def __init__(
        self,
        prefix: str | os.PathLike,
        *,
        num_sequences: int | None = None,
        num_documents_plus_one: int | None = None,
        dtype: Any = None,
    ) -> None:
        self.prefix = os.fspath(prefix)
        self._known = (num_sequences, num_documents_plus_one, dtype)
        self._arrays: dict[str, Any] | None = None
        self._read_range: RangeReader = epath.read_range

    def use_range_reader(self, read_range: RangeReader) -> None:
        """Read a remote ``.bin`` with ``read_range`` (e.g. through a cache of prefetched chunks)
        instead of one plain ranged GET per slice; it must pickle (a module-level function)."""
        self._read_range = read_range
        if self._arrays is not None:
            self._arrays["bin"] = None

    # -- pickling: only paths, known sizes and the reader travel into workers ---------------------
    def __getstate__(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "_known": self._known,
            "_arrays": None,
            "_read_range": self._read_range,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- header and arrays ------------------------------------------------------------------------
    @property
    def _a(self) -> dict[str, Any]:
        if self._arrays is None:
            self._arrays = self._open()
        return self._arrays

    @property
    def remote(self) -> bool:
        """The prefix is in object storage: ``.idx`` through the local cache, ``.bin`` by ranged
        reads (see :class:`RemoteTokenFile`)."""
        return epath.is_remote(self.prefix)

    def _open(self) -> dict[str, Any]:
        path = idx_path(self.prefix)
        try:
            if self.remote:
                path = epath.local_copy(path)
            with open(path, "rb") as f:
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise IndexedFormatError(f"{path}: index file not found") from None
        except ValueError:  # mmap of an empty file
            raise IndexedFormatError(f"{path}: empty index file") from None
        n, d, dtype = self._header(buf, path)
        expected = HEADER_SIZE + 12 * n + 8 * d
        if len(buf) not in (expected, expected + n):
            raise IndexedFormatError(
                f"{path}: {len(buf)} bytes, expected {expected} (or {expected + n} with modes) for "
                f"{n} sequences and {d} document-index entries: the file is truncated or corrupt"
            )
        lengths = np.frombuffer(buf, dtype="<i4", count=n, offset=HEADER_SIZE)
        pointers = np.frombuffer(buf, dtype="<i8", count=n, offset=HEADER_SIZE + 4 * n)
        documents = np.frombuffer(buf, dtype="<i8", count=d, offset=HEADER_SIZE + 12 * n)
        modes = None
        if len(buf) == expected + n:
            modes = np.frombuffer(buf, dtype=np.int8, count=n, offset=expected)
        if d < 1 or documents[-1] != n:
            raise IndexedFormatError(
                f"{path}: document index ends at {documents[-1] if d else None}, expected {n} "
                "(number of sequences)"
            )
        return {
            "n": n,
            "d": d,
            "dtype": dtype,
            "lengths": lengths,
            "pointers": pointers,
            "documents": documents,
            "modes": modes,
            "bin": None,
        }

    def _header(self, buf: Any, path: str) -> tuple[int, int, np.dtype]:
        if len(buf) < HEADER_SIZE:
            raise IndexedFormatError(f"{path}: {len(buf)} bytes, shorter than the 34-byte header")
        if buf[:9] != INDEX_MAGIC:
            raise IndexedFormatError(
                f"{path}: bad magic {bytes(buf[:9])!r}, expected {INDEX_MAGIC!r} (not a Megatron "
                "MMIDIDX index)"
            )
        (version,) = struct.unpack_from("<Q", buf, 9)
        if version != INDEX_VERSION:
            raise IndexedFormatError(f"{path}: version {version}, only {INDEX_VERSION} is known")
        dtype = dtype_from_code(buf[17], where=path)
        n, d = struct.unpack_from("<QQ", buf, 18)
        known_n, known_d, known_dtype = self._known
        if known_n is not None and (known_n, known_d) != (n, d):
            raise IndexedFormatError(
                f"{path}: has {n} sequences / {d} document-index entries, the sequences file says "
                f"{known_n} / {known_d}: rebuild it with `energon build-sequences`"
            )
        if known_dtype is not None and np.dtype(known_dtype) != dtype:
            raise IndexedFormatError(f"{path}: dtype {dtype}, expected {np.dtype(known_dtype)}")
        return n, d, dtype

    def _bin(self) -> np.ndarray:
        arrays = self._a
        if arrays["bin"] is None:
            path = bin_path(self.prefix)
            n = arrays["n"]
            itemsize = arrays["dtype"].itemsize
            expected = (
                int(arrays["pointers"][-1]) + int(arrays["lengths"][-1]) * itemsize if n else 0
            )
            size = _file_size(path)
            if size is None:
                raise IndexedFormatError(f"{path}: token file not found")
            if size != expected:
                raise IndexedFormatError(
                    f"{path}: {size} bytes, but the index describes {expected} bytes of "
                    f"{arrays['dtype']} tokens: wrong dtype, truncated, or the .bin does not belong "
                    "to this .idx"
                )
            if size == 0:
                arrays["bin"] = np.zeros(0, dtype=arrays["dtype"])
            elif self.remote:
                arrays["bin"] = RemoteTokenFile(path, arrays["dtype"], self._read_range)
            else:
                arrays["bin"] = np.memmap(path, dtype=arrays["dtype"], mode="r")
        return arrays["bin"]

    def byte_spans(self, index: int, offset: int = 0, length: int | None = None) -> tuple[int, int]:
        """Byte range in the ``.bin`` of what :meth:`get` returns (for prefetch hints)."""
        arrays = self._a
        itemsize = arrays["dtype"].itemsize
        if length is None:
            length = int(arrays["lengths"][index]) - offset
        start = int(arrays["pointers"][index]) + offset * itemsize
        return start, start + length * itemsize

    # -- public view ------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Number of sequences (megatron-core's ``len(IndexedDataset)``)."""
        if self._arrays is None and self._known[0] is not None:
            return int(self._known[0])
        return int(self._a["n"])

    @property
    def dtype(self) -> np.dtype:
        if self._arrays is None and self._known[2] is not None:
            return np.dtype(self._known[2])
        return self._a["dtype"]

    @property
    def sequence_lengths(self) -> np.ndarray:
        return self._a["lengths"]

    @property
    def sequence_pointers(self) -> np.ndarray:
        return self._a["pointers"]

    @property
    def document_indices(self) -> np.ndarray:
        return self._a["documents"]

    @property
    def modes(self) -> np.ndarray | None:
        return self._a["modes"]

    @property
    def num_documents(self) -> int:
        return int(self._a["d"]) - 1

    def get(self, index: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``[offset, offset+length)`` of sequence ``index`` (a read-only view of the mmap)."""
        arrays = self._a
        if not 0 <= index < arrays["n"]:
            raise IndexError(f"sequence {index} out of range [0, {arrays['n']}) in {self.prefix}")
        seq_len = int(arrays["lengths"][index])
        if length is None:
            length = seq_len - offset
        start = int(arrays["pointers"][index]) // arrays["dtype"].itemsize + offset
        return self._bin()[start : start + length]

    def __getitem__(self, index: int) -> np.ndarray:
        return self.get(index)

    def close(self) -> None:
        self._arrays = None


def _file_size(path: str) -> int | None:
    if epath.is_remote(path):
        try:
            return epath.stat(path)[0]
        except RemoteNotFoundError:
            return None
    return os.path.getsize(path) if os.path.exists(path) else None


class RemoteTokenFile:
    """A ``.bin`` in object storage that slices like the memory map it stands in for: ``f[a:b]``
    is one ranged read through ``read_range`` (a token leaf passes its chunk cache, so hinted
    windows are prefetched)."""

    def __init__(self, url: str, dtype: np.dtype, read_range: RangeReader = epath.read_range):
        self.url = url
        self.dtype = np.dtype(dtype)
        self.read_range = read_range

    def __getitem__(self, window: slice) -> np.ndarray:
        size = self.dtype.itemsize
        data = self.read_range(self.url, window.start * size, window.stop * size)
        return np.frombuffer(data, dtype=self.dtype)


def merge_prefixes(
    inputs: Iterable[str | os.PathLike], output: str | os.PathLike, *, multimodal: bool = False
) -> int:
    """Concatenate prefixes into ``output`` (megatron's merge tool); the first input's dtype wins.

    Returns the number of merged sequences.
    """
    inputs = [os.fspath(p) for p in inputs]
    if not inputs:
        raise ValueError("no input prefixes to merge")
    first = IndexedTokens(inputs[0])
    writer = TokenFileWriter(output, dtype=first.dtype, multimodal=multimodal)
    try:
        for prefix in inputs:
            writer.add_index(prefix)
    except BaseException:
        writer._bin.close()
        raise
    writer.finalize()
    return len(IndexedTokens(output))


def find_prefixes(directory: str | os.PathLike) -> list[str]:
    """Every ``X`` with both ``X.bin`` and ``X.idx`` in ``directory``, in sorted order."""
    directory = os.fspath(directory)
    names = set(os.listdir(directory))
    prefixes = sorted(n[:-4] for n in names if n.endswith(".idx") and n[:-4] + ".bin" in names)
    return [os.path.join(directory, p) for p in prefixes]
