"""Small real datasets for tests (real tar shards, real JPEGs, prepared with our prepare) and
uploading them to the loopback S3 server."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from energon.demo import write_captioning_shards, write_text_shards
from energon.megatron.indexed import TokenFileWriter
from energon.prepare.dataset import prepare_dataset

TEXT_YAML = """sample_type:
  __module__: megatron.energon
  __class__: TextSample
field_map:
  text: txt
"""

CAPTIONING_YAML = """sample_type:
  __module__: megatron.energon
  __class__: CaptioningSample
field_map:
  image: jpg
  caption: txt
"""


def make_text_dataset(
    root: Path, *, num_samples: int, num_shards: int, split=(("train", 1.0),), seed: int = 0
) -> Path:
    write_text_shards(
        root, num_samples=num_samples, num_shards=num_shards, min_chars=5, max_chars=60, seed=seed
    )
    prepare_dataset(root, split_parts_ratio=list(split), progress=False, num_workers=1)
    (root / ".nv-meta" / "dataset.yaml").write_text(TEXT_YAML)
    return root


def make_captioning_dataset(
    root: Path, *, num_samples: int, num_shards: int, split=(("train", 1.0),), seed: int = 0
) -> Path:
    write_captioning_shards(
        root, num_samples=num_samples, num_shards=num_shards, min_size=24, max_size=48, seed=seed
    )
    prepare_dataset(root, split_parts_ratio=list(split), progress=False, num_workers=1)
    (root / ".nv-meta" / "dataset.yaml").write_text(CAPTIONING_YAML)
    return root


def upload_to_s3(local: Path, url_prefix: str, endpoint: str | None = None) -> None:
    """Put a local folder (or one file) under ``s3://bucket/prefix/``, creating the bucket."""
    import boto3

    from energon.remote import s3

    bucket, prefix = s3.split_url(url_prefix)
    client = boto3.client("s3", endpoint_url=endpoint)
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
    for path in files:
        rel = path.name if local.is_file() else path.relative_to(local).as_posix()
        client.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=path.read_bytes())


def shard_paths(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.tar"))


def write_prefix(prefix, num_docs=50, seed=0, dtype="uint16"):
    """A Megatron ``.bin/.idx`` pair of random documents (each ends with token 0); returns them."""
    rng = np.random.default_rng(seed)
    w = TokenFileWriter(prefix, dtype=dtype)
    docs = []
    for _ in range(num_docs):
        doc = [*rng.integers(1, 500, int(rng.integers(1, 40))).tolist(), 0]
        docs.append(doc)
        w.add_document([doc])
    w.finalize()
    return docs
