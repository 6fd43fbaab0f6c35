"""``energon simulate``: what a configuration will do, from metadata alone, before training.

Nothing here has its own idea of the order. Every figure comes from the machinery the loader
runs: lengths from the loader's own arithmetic (``SavableDataset.len_ranks``, the spec's stream
counts), blend shares from :func:`~energon.loader.blend_report.simulate_blend`, and everything
about *which* samples come when from the ledger's simulated streams
(:class:`~energon.ledger.advance.SimulatedStream` over :func:`~energon.ledger.simulate.simulated_spec`:
the real stage chain over metadata), including exposure counting for samples per shard. So a
simulation is exact wherever the ledger is (the same assumptions: every sample loads; the hooks
that decide from data must be marked ``@uses_sample_meta``).

Figures: epoch length per rank and per logical stream; samples and slices per stream and source
(balance); blend shares per window; validation batches per rank (real and filler); a shuffle figure
(how often consecutive samples share a shard, against a perfect shuffle, and how widely a shard's
samples spread over the simulated window); samples per shard per epoch. Warnings name
misconfigurations (:func:`warnings_for`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from energon.errors import (
    EmptyDatasetError,
    MetadatasetError,
    NotSimulableError,
    UnknownSplitError,
)
from energon.ledger.advance import SimulatedStream
from energon.ledger.simulate import assumptions, simulated_spec
from energon.loader.blend_report import BlendReport, simulate_blend, source_names
from energon.loader.savable_dataset import SavableDataset
from energon.pipeline.blend_by import SampleSizes
from energon.pipeline.keys import pointer_target, pointers_of
from energon.pipeline.spec import PipelineSpec
from energon.source.meta import meta_reader
from energon.source.startup_reads import LeafReads
from energon.worker import WorkerConfig

SHUFFLE_WINDOW = 20_000  # samples the shuffle figures look at (the start of the first epoch)
PERFECT_SPREAD = 1 / math.sqrt(12)  # std of a uniform position over the window, as a fraction


@dataclasses.dataclass
class SimulationSettings:
    """What the loader will be built with (the CLI's options)."""

    world_size: int
    num_workers: int
    batch_size: int | None
    seed: int = 0
    shuffle_buffer_size: int | None = 100
    max_samples_per_sequence: int | None = 100
    packing_buffer_size: int | None = None
    steps: int | None = None  # training steps to simulate the blend and shuffle over
    window: int | None = None  # global samples per blend window (None: a tenth of those simulated)
    max_length: int | None = None  # the packing limit (tokens, else bytes) to check samples against
    task_encoder: Any = None

    def worker_config(self, rank: int = 0) -> WorkerConfig:
        return WorkerConfig(
            rank=rank,
            world_size=self.world_size,
            num_workers=self.num_workers,
            seed_offset=self.seed,
        )


@dataclasses.dataclass
class Simulation:
    config: str
    settings: SimulationSettings
    train: dict[str, Any] | None
    val: dict[str, Any] | None
    blend: BlendReport | None
    warnings: list[str]
    assumptions: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "settings": {
                k: v for k, v in dataclasses.asdict(self.settings).items() if k != "task_encoder"
            },
            "train": self.train,
            "val": self.val,
            "blend": self.blend.to_dict() if self.blend is not None else None,
            "warnings": self.warnings,
            "assumptions": self.assumptions,
        }

    def text(self) -> str:
        return format_text(self)


def build(
    config: str, settings: SimulationSettings, split: str, rank: int = 0, required: bool = False
) -> SavableDataset | None:
    """The dataset the loader would build for ``rank`` (None: the config has no such split, or
    it is empty; a split that is ``required`` must exist)."""
    from energon.loader.build import get_train_dataset, get_val_dataset

    common: dict[str, Any] = {
        "worker_config": settings.worker_config(rank),
        "batch_size": settings.batch_size,
        "packing_buffer_size": settings.packing_buffer_size,
    }
    if settings.task_encoder is not None:
        common["task_encoder"] = settings.task_encoder
    try:
        if split == "train":
            return get_train_dataset(
                config,
                shuffle_buffer_size=settings.shuffle_buffer_size,
                max_samples_per_sequence=settings.max_samples_per_sequence,
                **common,
            )
        return get_val_dataset(config, split_part=split, **common)
    except EmptyDatasetError:
        return None
    except UnknownSplitError:
        if required:
            raise
        return None
    except MetadatasetError as e:
        if f"no split {split!r}" in str(e) and not required:
            return None
        raise


def simulate(
    config: str, settings: SimulationSettings, *, val_split: str | None = None
) -> Simulation:
    """What ``config`` will do with ``settings``: the training split, and the validation split
    ``val_split`` (which must exist; by default ``val``, where the config has one)."""
    found: list[str] = []
    failure: ValueError | None = None
    try:
        train_ds = build(config, settings, "train")
    except ValueError as e:  # a misconfiguration the loader refuses: that is the finding
        train_ds, failure = None, e
        found.append(f"training would fail: {e}")
    val_ds = build(config, settings, val_split or "val", required=val_split is not None)
    val_split = val_split or "val"
    if train_ds is None and val_ds is None:
        if failure is not None:
            raise failure
        raise EmptyDatasetError(f"{config} has neither a train nor a {val_split} split")
    train = blend = None
    if train_ds is not None:
        train = train_figures(config, settings, train_ds)
        spec = train_ds.spec
        if spec.mode == "weight":
            samples = train["simulated_samples"]
            window = settings.window or max(1, samples // 10)
            blend = simulate_blend(spec, -(-samples // window) * window, window)
        found += warnings_for(spec, settings, train, blend)
    val = val_figures(config, settings, val_ds, val_split) if val_ds is not None else None
    if val is not None:
        found += val_warnings(val)
    spec = (train_ds or val_ds).spec
    return Simulation(config, settings, train, val, blend, found, assumptions(spec.task_encoder))


# -- training ---------------------------------------------------------------------------------
def train_figures(
    config: str, settings: SimulationSettings, dataset: SavableDataset
) -> dict[str, Any]:
    spec = dataset.spec
    R = settings.world_size
    per_rank = dataset.len_ranks(range(R))
    counts = spec.stream_sample_counts()
    sim = simulated_spec(spec)
    names = source_names(spec)
    exposure = [np.zeros(len(s.leaf), dtype=np.uint32) for s in sim.sources]
    ranges: list[list[tuple[int, int]]] = []  # per stream, per source: the samples it reads
    streams = [stream_epoch(sim, s, counts[s], exposure, ranges) for s in range(spec.num_streams)]
    starts = [shard_starts(source.leaf) for source in sim.sources]
    per_shard = samples_per_shard(sim, starts, exposure)
    micro = spec.batch_size or 1
    steps = settings.steps or max(1, min(max(per_rank, default=1), SHUFFLE_WINDOW // (micro * R)))
    try:
        samples = first_samples(sim, _window_positions(sim, steps * R))
        shuffle = shuffle_figures(sim, samples)
        window = settings.window or max(1, len(samples) // 10)
        delivered = delivered_shares(sim, samples, window)
    except NotSimulableError as e:
        shuffle = delivered = {"error": str(e)}
    return {
        "num_streams": spec.num_streams,
        "mode": spec.mode,
        "micro_batches_per_rank": per_rank,
        "samples_per_epoch": sum(counts),
        "streams": streams,
        "sources": [
            {
                "name": names[i],
                "samples": len(source),
                "weight": source.weight,
                "repetitions": source.repetitions,
                "shards": per_shard[i],
            }
            for i, source in enumerate(spec.sources)
        ],
        "shuffle": shuffle,
        "delivered": delivered,
        "startup_reads": startup_reads(sim, R, starts, ranges),
        "simulated_steps": steps,
        "simulated_samples": steps * R * micro,
    }


def stream_epoch(
    sim: PipelineSpec,
    stream_id: int,
    samples: int,
    exposure: list[np.ndarray],
    ranges: list[list[tuple[int, int]]],
) -> dict[str, Any]:
    """One stream's figures (its samples, micro-batches, and what each source's reader holds);
    the stream is moved through its epoch's items with the ledger's exposure counting
    (``exposure[s][i] += 1`` for every draw of sample ``i`` of source ``s``). The samples
    ``[a, b)`` its reader of each source reads go to ``ranges``."""
    stream = SimulatedStream(sim, stream_id)
    readers = stream.stream.stages[0].readers  # type: ignore[attr-defined]
    items = sim.batches_of(samples)
    figures = {
        "stream": stream_id,
        "samples": samples,
        "micro_batches": items,
        "sources": [{"samples": r.num_samples, "slices": r.num_slices} for r in readers],
    }
    ranges.append([(int(r.bounds[0]), int(r.bounds[-1])) for r in readers])
    stream.skip(items, exposure)
    return figures


def shard_starts(leaf: Any) -> np.ndarray:
    """The first sample of each of the leaf's shards, then its sample count."""
    starts = np.fromiter(leaf.shard_starts, dtype=np.int64)
    return np.append(starts, len(leaf))


def samples_per_shard(
    sim: PipelineSpec, starts: list[np.ndarray], exposure: list[np.ndarray]
) -> list[list[dict]]:
    """How often each (non-empty) shard's samples are drawn in one epoch, from the streams'
    exposure counts (:func:`stream_epoch`); ``starts``: each source's :func:`shard_starts`."""
    out = []
    for source, bounds, array in zip(sim.sources, starts, exposure):
        sizes = np.diff(bounds)
        kept = np.flatnonzero(sizes > 0)
        drawn = np.add.reduceat(array, bounds[kept], dtype=np.uint64) if len(kept) else []
        names = _shard_names(source.leaf.leaf, bounds, kept)
        out.append(
            [
                {"shard": name, "samples": n, "drawn": d}
                for name, n, d in zip(names, sizes[kept].tolist(), np.asarray(drawn).tolist())
            ]
        )
    return out


def _shard_names(leaf: Any, starts: np.ndarray, shards: np.ndarray) -> list[str]:
    """The names of the leaf's ``shards`` (``starts``: where each shard begins): from the leaf's
    list where it has one (read once, in order), else asked of its metadata reader."""
    names = getattr(leaf, "shard_names", None)
    if names is not None:
        listed = list(names)
        return [listed[k] for k in shards.tolist()]
    reader = meta_reader(leaf)
    return [reader.shard_name(int(starts[k])) for k in shards.tolist()]


def startup_reads(
    sim: PipelineSpec,
    world_size: int,
    starts: list[np.ndarray],
    ranges: list[list[tuple[int, int]]],
) -> dict[str, Any]:
    """Bytes each rank reads at start-up, index and metadata, not the samples
    (:mod:`energon.source.startup_reads`): ``summary`` (per source, the files every rank reads
    whole or in part, and their bytes), ``own_bytes`` per rank (the index of its own shards),
    ``bytes`` per rank (both). Sources of other kinds are listed in ``not_counted``."""
    names = source_names(sim)
    reads = [LeafReads.of(source.leaf.leaf, s) for source, s in zip(sim.sources, starts)]
    counted = [(i, r) for i, r in enumerate(reads) if r is not None]
    summary_bytes = sum(r.summary_bytes for _, r in counted)
    # rank r's positions r, r + W, ... cycle through the streams s = r (mod gcd(W, streams))
    step = math.gcd(world_size, sim.num_streams)
    own = [
        sum(
            r.own_bytes(ranges[s][i] for s in range(rank % step, sim.num_streams, step))
            for i, r in counted
        )
        for rank in range(world_size)
    ]
    return {
        "summary": [{"source": names[i], "files": r.summary} for i, r in counted],
        "summary_bytes": summary_bytes,
        "own_bytes": own,
        "bytes": [summary_bytes + o for o in own],
        "not_counted": [names[i] for i, r in enumerate(reads) if r is None],
    }


def first_samples(sim: PipelineSpec, positions: int) -> list[tuple[int, int, int]]:
    """(position, source, index) of every sample of the first ``positions`` global micro-batches,
    in order (stepping the simulated streams item by item)."""
    L = sim.num_streams
    streams: dict[int, SimulatedStream] = {}
    out = []
    for m in range(positions):
        stream = streams.get(m % L)
        if stream is None:
            stream = streams[m % L] = SimulatedStream(sim, m % L)
        try:
            key = stream.next()
        except StopIteration:
            continue
        for pointer in pointers_of(key):
            source, index = pointer_target(pointer)
            out.append((m, source, index))
    return out


def _window_positions(sim: PipelineSpec, positions: int) -> int:
    micro = sim.batch_size or 1
    return max(1, min(positions, SHUFFLE_WINDOW // micro))


def delivered_shares(
    sim: PipelineSpec, samples: list[tuple[int, int, int]], window: int
) -> dict[str, Any]:
    """Samples of each source among those *delivered* (after the shuffle buffer, in global order),
    per window of ``window`` samples: what the model sees, where the blend report counts picks.
    A blend weighted by size (``blend_by``) also gets each window's ``sizes`` per source."""
    n = len(sim.sources)
    by_size = sim.blend_by
    sizes = SampleSizes(sim.leaves, by_size.function, by_size.name) if by_size.by_size else None
    windows = []
    for start in range(0, len(samples), window):
        counts = [0] * n
        amounts = [0.0] * n
        for _, source, index in samples[start : start + window]:
            counts[source] += 1
            if sizes is not None:
                amounts[source] += sizes.size(source, index)
        windows.append({"start": start, "counts": counts, **({"sizes": amounts} if sizes else {})})
    totals = [sum(w["counts"][i] for w in windows) for i in range(n)]
    return {
        "samples": len(samples),
        "window": window,
        "totals": totals,
        "windows": windows,
        **({"unit": by_size.unit()} if sizes is not None else {}),
    }


def shuffle_figures(sim: PipelineSpec, samples: list[tuple[int, int, int]]) -> dict[str, Any]:
    """Over ``samples`` (the start of the first epoch, at most :data:`SHUFFLE_WINDOW`):
    ``same_shard``: share of consecutive samples (in global order: micro-batch after micro-batch)
    from the same shard; ``same_shard_if_random``: that share under a perfect shuffle of the same
    samples; ``spread``: how widely a shard's samples spread over the window (mean std of their
    places, as a fraction of the window; a perfect shuffle gives about 0.29)."""
    if len(samples) < 2:
        return {"samples": len(samples)}
    readers = [meta_reader(s.leaf.leaf) for s in sim.sources]
    shard_of = [(source, readers[source].locate(index)[0]) for _, source, index in samples]
    same = sum(1 for a, b in zip(shard_of, shard_of[1:]) if a == b)
    _, sizes = np.unique(np.array(shard_of), axis=0, return_counts=True)
    p = sizes / sizes.sum()
    places: dict[tuple[int, int], list[int]] = {}
    for place, shard in enumerate(shard_of):
        places.setdefault(shard, []).append(place)
    n = len(samples)
    spreads = [np.std(v) / n for v in places.values() if len(v) > 1]
    return {
        "samples": n,
        "same_shard": same / (n - 1),
        "same_shard_if_random": float((p * p).sum()),
        "spread": float(np.mean(spreads)) if spreads else 0.0,
        "spread_if_random": PERFECT_SPREAD,
        "shards_seen": len(places),
    }


# -- validation -------------------------------------------------------------------------------
def val_figures(
    config: str, settings: SimulationSettings, dataset: SavableDataset, split: str
) -> dict[str, Any]:
    """Micro-batches per rank in one validation pass: in total (what ``len(loader)`` says and the
    loader delivers) and how many of them are real (the rest are ``__padding__`` fillers)."""
    spec = dataset.spec
    R = settings.world_size
    sim = simulated_spec(spec)
    items = []
    for stream_id in range(spec.num_streams):
        stream = SimulatedStream(sim, stream_id)
        count = 0
        while True:
            try:
                stream.next()
            except StopIteration:
                break
            count += 1
        items.append(count)
    L = spec.num_streams
    totals = dataset.len_ranks(range(R))
    if spec.planned_validation:
        end = dataset.positions_per_pass() or 0
        real = [sum(1 for m in range(r, end, R) if m // L < items[m % L]) for r in range(R)]
    else:
        real = [sum(items[s] for s in range(L) if s % R == r) for r in range(R)]
    return {
        "split": split,
        "micro_batches_per_rank": totals,
        "real_per_rank": real,
        "fillers_per_rank": [t - r for t, r in zip(totals, real)],
        "items_per_stream": items,
        "samples": sum(len(s) for s in spec.sources),
    }


def val_warnings(val: dict[str, Any]) -> list[str]:
    real = val["real_per_rank"]
    if len(set(real)) > 1:
        return [
            f"uneven validation: ranks get {min(real)} to {max(real)} real micro-batches of "
            f"split {val['split']!r}; {sum(val['fillers_per_rank'])} filler micro-batches "
            "(flagged __padding__) keep them even. Weight losses by the padding flag."
        ]
    return []


# -- warnings ---------------------------------------------------------------------------------
def warnings_for(
    spec: PipelineSpec,
    settings: SimulationSettings,
    train: dict[str, Any],
    blend: BlendReport | None,
) -> list[str]:
    names = source_names(spec)
    found = []
    found += _duplicate_leaves(spec, names)
    found += _too_few_slices(spec, names, train)
    found += _tiny_shards(names, train, settings)
    if blend is not None:
        found += _rounded_away(blend)
    if settings.max_length is not None:
        found += _too_long(spec, names, settings.max_length)
    return found


def _duplicate_leaves(spec: PipelineSpec, names: list[str]) -> list[str]:
    seen: dict[tuple[str, str, int, int], int] = {}
    out = []
    for i, source in enumerate(spec.sources):
        fp = source.leaf.fingerprint()
        ident = (str(fp["path"]), source.leaf.split_part, source.start, source.end)
        if ident in seen:
            out.append(
                f"leaf listed twice: {names[i]} (sources {seen[ident]} and {i}) is the same data; "
                "both copies are read in the same order, so samples come in pairs"
            )
        else:
            seen[ident] = i
    return out


def _too_few_slices(spec: PipelineSpec, names: list[str], train: dict[str, Any]) -> list[str]:
    """Streams with nothing of a source, or sources with fewer shards than streams (streams then
    read small pieces of the same shards: little sequential I/O, and the shuffle mixes less)."""
    out = []
    for i, (name, source) in enumerate(zip(names, train["sources"])):
        empty = [s["stream"] for s in train["streams"] if s["sources"][i]["samples"] == 0]
        shards = len(source["shards"])
        if empty:
            out.append(
                f"fewer samples than readers: {name} has {source['samples']} samples for "
                f"{spec.num_streams} logical streams; {len(empty)} streams get none of it"
            )
        elif shards < spec.num_streams:
            out.append(
                f"fewer slices than readers: {name} has {shards} shards for {spec.num_streams} "
                "logical streams (world size x workers), so streams share shards and read small "
                "pieces of them; more, smaller shards give each stream its own slices"
            )
    return out


def _tiny_shards(
    names: list[str], train: dict[str, Any], settings: SimulationSettings
) -> list[str]:
    out = []
    for name, source in zip(names, train["sources"]):
        sizes = [s["samples"] for s in source["shards"]]
        if not sizes:
            continue
        limit = max(settings.batch_size or 1, int(np.median(sizes)) // 10)
        tiny = [s for s in source["shards"] if s["samples"] < limit]
        if tiny:
            listed = ", ".join(f"{s['shard']} ({s['samples']})" for s in tiny[:5])
            out.append(
                f"tiny shards in {name}: {len(tiny)} of {len(sizes)} shards hold fewer than "
                f"{limit} samples: {listed}{' ...' if len(tiny) > 5 else ''}"
            )
    return out


def _rounded_away(blend: BlendReport) -> list[str]:
    out = []
    for source in blend.sources:
        if source["requested"] > 0 and source["consumed"] == 0:
            out.append(
                f"weight rounds away: {source['name']} asks for "
                f"{100 * source['requested']:.3g}% of the samples but none is drawn in the first "
                f"{sum(s['consumed'] for s in blend.sources)} samples"
            )
    return out


def _too_long(spec: PipelineSpec, names: list[str], max_length: int) -> list[str]:
    """Samples longer than the packing limit (see :func:`sample_length`); a leaf listed twice is
    checked once."""
    out = []
    checked: set[tuple[str, str, int, int]] = set()
    for name, source in zip(names, spec.sources):
        ident = (
            str(source.leaf.fingerprint()["path"]),
            source.leaf.split_part,
            source.start,
            source.end,
        )
        if ident in checked:
            continue
        checked.add(ident)
        reader = meta_reader(source.leaf)
        longer = []
        for index in _sampled(range(source.start, source.end)):
            length = sample_length(reader, index)
            if length is not None and length > max_length:
                longer.append((reader.key(index) or str(index), length))
        if longer:
            listed = ", ".join(f"{k} ({n})" for k, n in longer[:5])
            out.append(
                f"samples longer than the packing limit {max_length} in {name}: "
                f"{len(longer)} of those checked, e.g. {listed}"
            )
    return out


def sample_length(reader: Any, index: int) -> int | None:
    """A sample's length as packing sees it, from the index: its token count where known, else
    the bytes of its parts (not its tar record, which adds headers and padding), else the bytes
    of its record (a JSONL line)."""
    tokens = reader.tokens(index)
    if tokens is not None:
        return tokens
    parts = reader.part_sizes(index)
    if parts:
        return sum(parts.values())
    return reader.byte_range(index)[1]


def _sampled(indices: range, limit: int = 10_000) -> Iterable[int]:
    step = max(1, len(indices) // limit)
    return indices[::step]


# -- text -------------------------------------------------------------------------------------
def format_text(sim: Simulation) -> str:
    s = sim.settings
    lines = [
        f"{sim.config}: world size {s.world_size}, {s.num_workers} workers per rank, "
        f"micro-batch {s.batch_size}"
    ]
    train = sim.train
    if train is not None:
        per_rank = train["micro_batches_per_rank"]
        lines.append(
            f"train: {train['num_streams']} logical streams, {train['samples_per_epoch']} samples "
            f"per epoch; micro-batches per rank per epoch: {_spread(per_rank)}"
        )
        mb = [st["micro_batches"] for st in train["streams"]]
        smp = [st["samples"] for st in train["streams"]]
        lines.append(f"  per stream: samples {_spread(smp)}, micro-batches {_spread(mb)}")
        for i, source in enumerate(train["sources"]):
            slices = [st["sources"][i]["slices"] for st in train["streams"]]
            drawn = [sh["drawn"] for sh in source["shards"]]
            lines.append(
                f"  source {source['name']}: {source['samples']} samples, weight "
                f"{source['weight']:g}, slices per stream {_spread(slices)}, "
                f"{len(drawn)} shards, drawn per shard per epoch {_spread(drawn)}"
            )
        sh = train["shuffle"]
        if "same_shard" in sh:
            lines.append(
                f"  shuffle (first {sh['samples']} samples): consecutive samples share a shard "
                f"{100 * sh['same_shard']:.1f}% of the time (perfect shuffle: "
                f"{100 * sh['same_shard_if_random']:.1f}%); shard spread {sh['spread']:.3f} "
                f"(perfect: {sh['spread_if_random']:.3f})"
            )
        elif "error" in sh:
            lines.append(f"  shuffle: not simulable: {sh['error']}")
        lines += _startup_lines(train["startup_reads"])
    if sim.blend is not None:
        lines.append("blend (requested vs. drawn shares per window):")
        lines.append(sim.blend.table(max_rows=12))
    if sim.val is not None:
        v = sim.val
        lines.append(
            f"validation ({v['split']}, {v['samples']} samples): micro-batches per rank "
            f"{v['micro_batches_per_rank']}, real {v['real_per_rank']}, fillers "
            f"{v['fillers_per_rank']}"
        )
    lines.append("warnings:" if sim.warnings else "warnings: none")
    lines += [f"  - {w}" for w in sim.warnings]
    lines.append("assumes: " + "; ".join(sim.assumptions))
    return "\n".join(lines)


def _startup_lines(reads: dict[str, Any]) -> list[str]:
    if not reads["summary"]:
        return []
    files = sorted({f.split("/", 1)[-1] for source in reads["summary"] for f in source["files"]})
    lines = [
        f"  start-up reads per rank (index and metadata, not samples): {_spread(reads['bytes'])} "
        f"bytes = {reads['summary_bytes']:,} on every rank ({', '.join(files)}) + its own "
        f"shards' index {_spread(reads['own_bytes'])} (.tar.idx, shard table blocks)"
    ]
    if reads["not_counted"]:
        lines.append(
            f"    not counted (not a prepared WebDataset): {', '.join(reads['not_counted'])}"
        )
    return lines


def _spread(values: list[int]) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}..{hi} (mean {sum(values) / len(values):.1f})"
