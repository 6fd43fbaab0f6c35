"""Parquet and Arrow datasets for tests: the same samples as a prepared tar dataset, one file per
shard, with real JPEG bytes; and HF-style image/audio columns."""

from __future__ import annotations

import io
import tarfile
import wave
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from energon.format.parquet import prepare_parquet
from energon.format.split import read_split

CAPTIONING_YAML = """sample_type:
  __module__: megatron.energon
  __class__: CaptioningSample
field_map:
  image: jpg
  caption: txt
key_column: key
"""


def shard_rows(shard: Path) -> dict[str, list]:
    """The samples of a tar shard as columns: ``key`` and one binary column per part."""
    rows: dict[str, dict[str, bytes]] = {}
    with tarfile.open(shard) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            key, _, part = member.name.rsplit("/", 1)[-1].partition(".")
            rows.setdefault(key, {})[part] = tar.extractfile(member).read()
    parts = sorted({p for r in rows.values() for p in r})
    columns: dict[str, list] = {"key": list(rows)}
    for part in parts:
        columns[part] = [r.get(part) for r in rows.values()]
    return columns


def tar_as_parquet(
    tar_root: Path,
    out: Path,
    *,
    row_group_size: int = 4,
    arrow: str | None = None,
    prepare: bool = True,
) -> Path:
    """Write every shard of a prepared tar dataset as one Parquet file (``arrow="file"`` or
    ``"stream"``: Arrow IPC) with the same rows in the same order, the same splits, and a
    dataset.yaml that maps the same fields (plus the key column)."""
    split = read_split(tar_root)
    shards = sorted({s for names in split.split_parts.values() for s in names})
    names = {}
    for shard in shards:
        table = pa.table(shard_rows(tar_root / shard))
        suffix = ".parquet" if arrow is None else ".arrow"
        name = shard.rsplit(".", 1)[0] + suffix
        names[shard] = name
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        write_table(table, out / name, row_group_size, arrow)
    if prepare:
        patterns = [
            (split_name, "|".join(names[s].replace(".", r"\.") for s in files) or "$^")
            for split_name, files in split.split_parts.items()
        ]
        prepare_parquet(out, split_parts_patterns=patterns, progress=False)
        (out / ".nv-meta" / "dataset.yaml").write_text(CAPTIONING_YAML)
    return out


def write_table(table: pa.Table, path: Path, row_group_size: int, arrow: str | None) -> None:
    if arrow is None:
        pq.write_table(table, path, row_group_size=row_group_size)
        return
    opener = pa.ipc.new_file if arrow == "file" else pa.ipc.new_stream
    with pa.OSFile(str(path), "wb") as sink, opener(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=row_group_size):
            writer.write_batch(batch)


def wav_bytes(samples: int, rate: int = 8000, seed: int = 0) -> bytes:
    """A real mono 16-bit WAV file."""
    data = (np.random.default_rng(seed).standard_normal(samples) * 3000).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(data.tobytes())
    return buffer.getvalue()


def jpeg_bytes(value: int, size: tuple[int, int] = (10, 14)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((*size, 3), value % 256, np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()
