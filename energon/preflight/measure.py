"""``energon simulate --measure``: how fast one worker will be, and how much memory it needs, from
decoding a small random sample of the data.

It runs what a worker runs: real streams of the configuration (chosen at random, seeded), item by
item, in this process, with the worker-side stats probe (:mod:`energon.observe.probe`) on, so the
time per stage (read, decode, encode, batch) is measured by the same instrumentation that
``loader.stats()`` reports. One worker's throughput is samples over busy time; the workers needed
for a target rate follow from it. Memory per stage is measured on the items themselves: the bytes
read per sample (from the index), the bytes of a decoded sample, and of a batch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from energon.observe import probe
from energon.observe.probe import STAGES, Board
from energon.pipeline.keys import pointer_target, pointers_of
from energon.plan.rng import CounterRng, stable_seed
from energon.source.meta import meta_reader

PREFETCH_FACTOR = 2  # items a worker keeps ready (the loader's default prefetch_factor)


@dataclasses.dataclass
class Measurement:
    samples: int
    items: int
    seconds: dict[str, float]  # per stage, summed over the measured samples
    samples_per_second_per_worker: float
    raw_bytes_per_sample: float
    decoded_bytes_per_sample: float
    item_bytes: float
    worker_memory_bytes: float
    target: float | None
    workers_needed: int | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def text(self) -> str:
        busy = {k: v for k, v in self.seconds.items() if k != "wait"}
        total = sum(busy.values()) or 1.0
        per = ", ".join(
            f"{k} {1e3 * v / max(1, self.samples):.2f} ms ({100 * v / total:.0f}%)"
            for k, v in busy.items()
            if v > 0
        )
        lines = [
            f"measured {self.samples} samples ({self.items} items) in this process:",
            f"  per sample: {per}",
            f"  one worker: about {self.samples_per_second_per_worker:.0f} samples/s",
            f"  memory: {_mib(self.raw_bytes_per_sample)} read and "
            f"{_mib(self.decoded_bytes_per_sample)} decoded per sample, {_mib(self.item_bytes)} "
            f"per item; about {_mib(self.worker_memory_bytes)} of items in flight per worker",
        ]
        if self.target is not None:
            lines.append(
                f"  for {self.target:g} samples/s: about {self.workers_needed} workers "
                "(per rank, if each rank must reach it)"
            )
        return "\n".join(lines)


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def measure(
    config: str,
    settings: Any,
    *,
    samples: int = 64,
    target: float | None = None,
    progress: bool = False,
    seed: int = 0,
) -> Measurement:
    """Decode about ``samples`` samples of ``config`` (built as ``settings`` says, see
    :class:`energon.preflight.simulate.SimulationSettings`) through the real pipeline of random streams."""
    from energon.preflight.simulate import build

    dataset = build(config, settings, "train") or build(config, settings, "val")
    if dataset is None:
        raise ValueError(f"{config}: nothing to measure")
    spec = dataset.spec
    board = Board(1)
    probe.activate(board, 0)
    rng = CounterRng(stable_seed(seed, "measure"))
    loaded = 0
    items = 0
    item_bytes: list[int] = []
    raw: list[int] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=samples, desc="Measuring", unit="sample")
    try:
        ids = list(range(spec.num_streams))
        rng.shuffle(ids)
        streams = [dataset.build_stream(i) for i in ids[:4]]  # a few random streams, in turn
        turn = 0
        while loaded < samples and streams:
            stream = streams[turn % len(streams)]
            probe.ACTIVE.enter(probe.PLAN)
            try:
                value, key = stream.next()
            except StopIteration:
                streams.remove(stream)
                continue
            finally:
                probe.ACTIVE.enter(probe.WAIT)
            turn += 1
            probe.ACTIVE.enter(probe.TRANSFER)
            torch.utils.data.default_convert(value)
            probe.ACTIVE.enter(probe.WAIT)
            items += 1
            item_bytes.append(nbytes(value))
            raw += _raw_bytes(spec, key)
            now = int(board.hot[0, probe.SAMPLES])
            if bar is not None:
                bar.update(now - loaded)
            loaded = now
        decoded = _decoded_bytes(dataset, spec, rng, min(8, samples))
    finally:
        probe.deactivate()
        state = board.states()[0]
        board.close()
        if bar is not None:
            bar.close()
    seconds = {name: state["seconds"][name] for name in STAGES if name != "wait"}
    busy = sum(seconds.values())
    rate = state["samples"] / busy if busy > 0 else 0.0
    mean_item = float(np.mean(item_bytes)) if item_bytes else 0.0
    return Measurement(
        samples=state["samples"],
        items=items,
        seconds=seconds,
        samples_per_second_per_worker=rate,
        raw_bytes_per_sample=float(np.mean(raw)) if raw else 0.0,
        decoded_bytes_per_sample=decoded,
        item_bytes=mean_item,
        worker_memory_bytes=(PREFETCH_FACTOR + 1) * mean_item
        + (spec.packing_buffer_size or 0) * decoded,
        target=target,
        workers_needed=math.ceil(target / rate) if target and rate > 0 else None,
    )


def _raw_bytes(spec: Any, key: Any) -> list[int]:
    out = []
    for pointer in pointers_of(key):
        source, index = pointer_target(pointer)
        size = meta_reader(spec.sources[source].leaf).byte_range(index)[1]
        if size is not None:
            out.append(size)
    return out


def _decoded_bytes(dataset: Any, spec: Any, rng: CounterRng, count: int) -> float:
    """Mean bytes of a decoded sample (before the task encoder), over ``count`` random samples."""
    sizes = []
    for _ in range(count):
        source = rng.randbelow(len(spec.sources))
        leaf = spec.sources[source].leaf
        first, end = spec.sources[source].start, spec.sources[source].end
        if end <= first:
            continue
        index = first + rng.randbelow(end - first)
        try:
            sample = leaf.load(index, spec.decoder, (source, index))
        except Exception:  # a broken sample says nothing about the size of the others
            continue
        sizes.append(nbytes(sample))
    return float(np.mean(sizes)) if sizes else 0.0


def nbytes(value: Any, _depth: int = 0) -> int:
    """Bytes held by arrays, tensors, bytes and strings in ``value`` (containers, dataclasses)."""
    if _depth > 8 or value is None:
        return 0
    if isinstance(value, torch.Tensor):
        return value.element_size() * value.nelement()
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(nbytes(v, _depth + 1) for k, v in value.items() if not str(k).startswith("__"))
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v, _depth + 1) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(
            nbytes(getattr(value, f.name), _depth + 1)
            for f in dataclasses.fields(value)
            if not f.name.startswith("__")
        )
    if hasattr(value, "size") and hasattr(value, "mode"):  # a PIL image
        w, h = value.size
        return w * h * len(value.getbands())
    return 0
