"""Synthetic datasets for the demo, the tests and the benchmarks: captioning and text shards
(``datasets``) and small audio/video clips (``av``)."""

from energon.demo.datasets import (
    planned_image_sizes,
    render_photo_like_jpeg,
    sample_key,
    shard_name,
    shard_sample_counts,
    write_captioning_shards,
    write_text_shards,
)

__all__ = [
    "planned_image_sizes",
    "render_photo_like_jpeg",
    "sample_key",
    "shard_name",
    "shard_sample_counts",
    "write_captioning_shards",
    "write_text_shards",
]
