"""Real loader runs to compare the ledger and cursor edits with, and task encoders that pack and
group (from metadata, or from decoded data)."""

from __future__ import annotations

import os
from pathlib import Path

from energon import WorkerConfig, get_savable_loader, get_train_dataset, stateless
from energon.pipeline.keys import as_key
from energon.task_encoder.base import DefaultTaskEncoder, uses_sample_meta

CONFIGS = {
    "plain": dict(batch_size=3, shuffle_buffer_size=None, max_samples_per_sequence=4),
    "shuffled": dict(batch_size=3, shuffle_buffer_size=7, max_samples_per_sequence=5),
    "unbatched": dict(batch_size=None, shuffle_buffer_size=5, max_samples_per_sequence=None),
}


def write_blend(
    folder: Path, paths: list[Path], weights: list[float], epochized: bool = False
) -> Path:
    """A metadataset YAML blending ``paths`` (weights, or repetitions when epochized)."""
    key, value = ("blend_epochized", "repetitions") if epochized else ("blend", "weight")
    lines = ["__module__: megatron.energon", "__class__: MetadatasetV2", "splits:", "  train:"]
    lines.append(f"    {key}:")
    for n, (path, weight) in enumerate(zip(paths, weights)):
        lines.append(f"      - {value}: {weight}")
        lines.append(f"        path: {os.fspath(path)}")
        lines.append(f"        subflavors: {{part: {n}}}")
    target = folder / ("epochized.yaml" if epochized else "blend.yaml")
    target.write_text("\n".join(lines) + "\n")
    return target


def train_dataset(path, *, rank=0, world_size=1, num_workers=0, num_streams=None, **config):
    wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
    kwargs = dict(CONFIGS["shuffled"])
    kwargs.update(config)
    if num_streams is not None:
        kwargs["num_streams"] = num_streams
    return get_train_dataset(path, worker_config=wc, **kwargs)


def run_ranks(path, world_size, steps, *, states=None, journal=None, **config):
    """Every rank's loader (in this process) for ``steps`` steps; returns (per step, per rank: the
    delivered batch's restore key as plain tuples) and the states saved afterwards."""
    loaders = []
    for rank in range(world_size):
        dataset = train_dataset(path, rank=rank, world_size=world_size, **config)
        loader = get_savable_loader(dataset)
        if journal is not None:
            loader.start_journal(journal)
        if states is not None:
            loader.restore_state_rank(states[rank])
        loaders.append(loader)
    iterators = [iter(loader) for loader in loaders]
    delivered = [[restore_key(next(it)) for it in iterators] for _ in range(steps)]
    return delivered, [loader.save_state_rank() for loader in loaders]


def restore_key(batch) -> tuple:
    key = batch["__restore_key__"] if isinstance(batch, dict) else batch.__restore_key__
    return as_key(key)


def text_bytes(meta) -> int:
    return meta.part_sizes["txt"]


class MetaPackingEncoder(DefaultTaskEncoder):
    """Packs texts greedily by their byte length (known from the index, not from the data)."""

    limit = 90

    @uses_sample_meta
    def select_samples_to_pack(self, metas):
        groups, current, used = [], [], 0
        for meta in sorted(metas, key=lambda m: (text_bytes(m), m.source, m.index)):
            if current and used + text_bytes(meta) > self.limit:
                groups.append(current)
                current, used = [], 0
            current.append(meta)
            used += text_bytes(meta)
        if current:
            groups.append(current)
        return groups

    @stateless
    def pack_selected_samples(self, samples):
        return {
            "__key__": ",".join(s.__key__ for s in samples),
            "__restore_key__": (),
            "n": len(samples),
        }

    def batch(self, samples):
        return {"__key__": [s["__key__"] for s in samples], "__restore_key__": ()}


class MetaGroupingEncoder(DefaultTaskEncoder):
    """Batches short and long texts apart, judged by byte length from the index."""

    @uses_sample_meta
    def batch_group_criterion(self, meta):
        return ("short" if text_bytes(meta) < 30 else "long"), None


class DataPackingEncoder(DefaultTaskEncoder):
    """Packs by the decoded text's length: unknowable without reading data (journal needed)."""

    @stateless
    def select_samples_to_pack(self, samples):
        ordered = sorted(samples, key=lambda s: (len(s.text), s.__key__))
        return [ordered[i : i + 2] for i in range(0, len(ordered), 2)]

    @stateless
    def pack_selected_samples(self, samples):
        return {"__key__": ",".join(s.__key__ for s in samples), "__restore_key__": ()}

    def batch(self, samples):
        return {"__key__": [s["__key__"] for s in samples], "__restore_key__": ()}


class SkippingEncoder(DefaultTaskEncoder):
    """Drops texts whose decoded length is a multiple of 5 (data-dependent: journal needed)."""

    @stateless
    def encode_sample(self, sample):
        from energon import SkipSample

        if len(sample.text) % 5 == 0:
            raise SkipSample()
        return sample
