"""The cost of writing decoded images into their padded batch slots, next to a memset of the slots.

Issue 15, goal 1: with the default float output a batch is 32 x 3 x ~630 x ~635 float32 (~150 MB),
so writing it is a large share of a sample's cost. This times, per image and in CPU time, what the
batch stage does for each decoded JPEG of the captioning set (``to_padded_planar``: the pixels as
planes in the slot's top-left corner, ``v / 255`` for float, zeros around them) in slots shaped
like the real batches (the largest height and width of each 32 images), and, on the same slots,
a plain fill with zeros (the least any loop writing that memory can cost). Two batches alternate,
as in a loop that holds one while the next is made.

Then, end to end, the CPU time per sample of a 0-worker loader through the public API
(``get_train_dataset`` + ``get_loader``, batch 32, shuffle buffer 100, slices of 100) over
``--batches`` batches after 10, with float and with uint8 output.

To compare two versions of the library, run it from each tree in turn:
``PYTHONPATH=<tree> python tools/benchmarks/bench_slot_write.py``.

Usage: python tools/benchmarks/bench_slot_write.py [--root bench_data] [--images 256] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import DEFAULT_ROOT, ensure_workload, machine_summary  # noqa: E402
from bench_raw import iter_payloads, plan_tasks  # noqa: E402

from energon.decode import planar  # noqa: E402
from energon.decode.jpeg import decode_jpeg  # noqa: E402

BATCH = 32


def decoded_images(root: str, count: int) -> list[np.ndarray]:
    """The first ``count`` JPEGs of the captioning set in shard order, decoded to RGB uint8."""
    images: list[np.ndarray] = []
    for task in plan_tasks(ensure_workload("captioning", root), count):
        for payload in iter_payloads(task, "jpg"):
            pixels = decode_jpeg(payload, "RGB")
            if pixels is None:
                raise SystemExit(
                    "needs simplejpeg (pip install -e '.[fast]' where it is not a default dependency)"
                )
            images.append(pixels)
    return images


def batch_slots(images: list[np.ndarray], dtype: type) -> list[np.ndarray]:
    """One slot per image, each batch of 32 shaped by its largest image, in two buffers that
    alternate from batch to batch."""
    height = max(image.shape[0] for image in images)
    width = max(image.shape[1] for image in images)
    buffers = [np.empty(BATCH * 3 * height * width, dtype) for _ in range(2)]
    slots = []
    for start in range(0, len(images), BATCH):
        group = images[start : start + BATCH]
        shape = (3, max(i.shape[0] for i in group), max(i.shape[1] for i in group))
        size = int(np.prod(shape))
        buffer = buffers[(start // BATCH) % 2]
        slots += [buffer[k * size : (k + 1) * size].reshape(shape) for k in range(len(group))]
    return slots


def cpu_ms_per_image(images: list[np.ndarray], slots: list[np.ndarray], write: bool) -> float:
    started = time.process_time()
    for pixels, slot in zip(images, slots):
        if write:
            planar.to_padded_planar(pixels, slot)
        else:
            slot.fill(0)
    return (time.process_time() - started) / len(images) * 1e3


def loader_cpu_ms_per_sample(root: str, image_decode: str, batches: int) -> float:
    from energon import (
        DefaultTaskEncoder,
        SampleDecoder,
        WorkerConfig,
        get_loader,
        get_train_dataset,
    )

    task_encoder = DefaultTaskEncoder()
    task_encoder.decoder = SampleDecoder(image_decode=image_decode)
    dataset = get_train_dataset(
        ensure_workload("captioning", root).path,
        batch_size=BATCH,
        shuffle_buffer_size=100,
        max_samples_per_sequence=100,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=task_encoder,
    )
    batch_iter = iter(get_loader(dataset))
    first = next(batch_iter)
    expected = torch.uint8 if image_decode.endswith("8") else torch.float32
    if first.image.dtype != expected:
        raise SystemExit(f"{image_decode} gave {first.image.dtype} images")
    for _ in range(9):
        next(batch_iter)
    started = time.process_time()
    for _ in range(batches):
        next(batch_iter)
    return (time.process_time() - started) / (batches * BATCH) * 1e3


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=DEFAULT_ROOT, help="where the workloads live")
    parser.add_argument("--images", type=int, default=256, help="images (in batches of 32)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the first warms up")
    parser.add_argument("--batches", type=int, default=60, help="timed loader batches (0: skip)")
    args = parser.parse_args(argv)
    print(machine_summary())
    print(f"energon from {os.path.dirname(os.path.dirname(planar.__file__))}")
    images = decoded_images(args.root, args.images)
    print(f"{len(images)} images; native loops: {planar._native() is not None}")
    print("| output | slot write ms/image (median; rounds) | fill(0) of the same slots ms/image |")
    print("| --- | --- | --- |")
    for dtype in (np.float32, np.uint8):
        slots = batch_slots(images, dtype)
        writes, fills = [], []
        for _ in range(args.rounds):
            writes.append(cpu_ms_per_image(images, slots, write=True))
            fills.append(cpu_ms_per_image(images, slots, write=False))
        writes, fills = writes[1:] or writes, fills[1:] or fills  # the first round warms up
        rounds = " / ".join(f"{w:.3f}" for w in writes)
        print(
            f"| {np.dtype(dtype).name} | {statistics.median(writes):.3f} ({rounds}) "
            f"| {statistics.median(fills):.3f} |"
        )
    if args.batches:
        del images
        for image_decode in ("torchrgb", "torchrgb8"):
            cpu = loader_cpu_ms_per_sample(args.root, image_decode, args.batches)
            print(f"loader, 0 workers, {image_decode}: {cpu:.3f} ms CPU per sample")


if __name__ == "__main__":
    main()
