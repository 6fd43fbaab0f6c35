"""JPEG decoding on the GPU against decoding in the workers, through the loader, plus the pixels.

Throughput (``--workers``, ``--modes``): each (mode, worker count) is a fresh process that
iterates the captioning loader like a training loop and ends each batch as float32 images on the
device (bench_timed.py: warm-up, then a fixed time; a CUDA synchronize before the clock stops):

* ``cpu_uint8``: ``image_decode="torchrgb8"`` (workers decode with libjpeg-turbo), then
  ``batch.image.to(device, non_blocking=True)`` and ``ImageNormalizer`` on the device;
* ``device``: ``image_decode="encoded"`` (workers only read), then ``DeviceImageDecoder(device,
  ImageNormalizer(...))(batch.image)``: nvJPEG in the main process, one batched call per batch;
* ``cpu_float``: the default ``torchrgb`` float batch, ``.to(device, non_blocking=True)``.

Reported: samples/s, CPU per sample (main process + workers, every thread), the main process's
share, GPU memory peak. Without CUDA every mode runs with ``device="cpu"`` (a dry run).

Pixels (``--pixels N``): JPEGs of the workload (the first N) and re-encodings of them with
4:4:4, 4:2:2 and 4:2:0 chroma subsampling, progressive and grayscale, decoded by the CPU path
(energon's ``torchrgb8``: libjpeg-turbo, accurate DCT, fancy upsampling, as Pillow), by nvJPEG
(``DeviceImageDecoder``), by libjpeg-turbo with simple ("fast") upsampling and by torchvision's
CPU decoder; the max / mean absolute difference to the CPU path and the share of values off by
more than 1.

Usage: python tools/benchmarks/bench_gpu_decode.py --dataset PATH [--pixels 64]
           [--workers 0,2,8] [--modes cpu_uint8,device] [--seconds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_timed import (  # noqa: E402
    BATCH_SIZE,
    print_result,
    record,
    run_child_in_time,
    stamp,
    timed_run,
)

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
IMAGE_DECODE = {"cpu_uint8": "torchrgb8", "device": "encoded", "cpu_float": "torchrgb"}
START_COST_SECONDS = 8.0  # process start, imports, CUDA context, workers


def _device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# -- throughput ------------------------------------------------------------------------------------


def _consumer(mode: str, device):
    """What the training loop does with each batch in ``mode``: float images on ``device``."""
    from energon import DeviceImageDecoder, ImageNormalizer

    normalizer = ImageNormalizer(MEAN, STD)
    if mode == "device":
        decoder = DeviceImageDecoder(device, normalizer)
        return decoder, lambda batch: decoder(batch.image)
    if mode == "cpu_uint8":
        return None, lambda batch: normalizer(batch.image.to(device, non_blocking=True))
    return None, lambda batch: batch.image.to(device, non_blocking=True)


def child(spec: dict[str, Any]) -> None:
    import torch

    from energon import (
        DefaultTaskEncoder,
        SampleDecoder,
        WorkerConfig,
        get_loader,
        get_train_dataset,
    )

    device = _device()
    encoder = DefaultTaskEncoder()
    encoder.decoder = SampleDecoder(image_decode=IMAGE_DECODE[spec["mode"]])
    dataset = get_train_dataset(
        spec["path"],
        batch_size=BATCH_SIZE,
        shuffle_buffer_size=100,
        max_samples_per_sequence=100,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=spec["workers"]),
        task_encoder=encoder,
    )
    decoder, use = _consumer(spec["mode"], device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    result = timed_run(
        iter(get_loader(dataset)), lambda b: len(b.image), spec["warm"], spec["seconds"], use, sync
    )
    result["device"] = str(device)
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
        result["gpu_peak_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20)
    if decoder is not None:
        result["cpu_fallbacks"] = decoder.cpu_fallbacks
        result["device_images"] = decoder.device_images
        result["device_error"] = decoder.device_error
    print_result(result)


def throughput(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for workers in [int(w) for w in args.workers.split(",")]:
        for mode in args.modes.split(","):
            spec = {"mode": mode, "workers": workers, "path": args.dataset}
            spec |= {"seconds": args.seconds, "warm": args.warm}
            script = os.path.abspath(__file__)
            row = run_child_in_time(script, spec, args.deadline, START_COST_SECONDS)
            rows.append(row)
            stamp(f"{mode} {workers} workers: {row.get('error') or _brief(row)}")
            record(args.json, "gpu_decode_throughput", rows)
    return rows


def _brief(row: dict[str, Any]) -> str:
    return (
        f"{row['samples_per_s']:.0f} samples/s, {row['cpu_ms_per_sample']} ms CPU/sample, "
        f"main {row['main_cores_busy']:.2f} cores"
    )


# -- pixels ----------------------------------------------------------------------------------------


def dataset_jpegs(path: str, count: int) -> list[bytes]:
    """The first ``count`` JPEGs of the workload's shards, in shard order."""
    out: list[bytes] = []
    parts = os.path.join(path, "parts")
    for name in sorted(os.listdir(parts)):
        with tarfile.open(os.path.join(parts, name)) as tar:
            for member in tar:
                if member.name.endswith(".jpg"):
                    out.append(tar.extractfile(member).read())
                    if len(out) == count:
                        return out
    return out


def pixel_cases(jpegs: list[bytes]) -> dict[str, list[bytes]]:
    """The workload's JPEGs, and a few of them re-encoded with other settings."""
    from PIL import Image

    def encode(data: bytes, **options: Any) -> bytes:
        image = Image.open(io.BytesIO(data))
        if options.pop("gray", False):
            image = image.convert("L")
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=90, **options)
        return buffer.getvalue()

    few = jpegs[:8]
    return {
        "workload (Pillow q90, 4:2:0)": jpegs,
        "4:4:4": [encode(d, subsampling=0) for d in few],
        "4:2:2": [encode(d, subsampling=1) for d in few],
        "4:2:0": [encode(d, subsampling=2) for d in few],
        "4:2:0 progressive": [encode(d, subsampling=2, progressive=True) for d in few],
        "grayscale": [encode(d, gray=True) for d in few],
    }


def _difference(reference: list, other: list) -> dict[str, Any]:
    import torch

    worst, total, over_one, values = 0, 0.0, 0, 0
    for ref, img in zip(reference, other):
        if tuple(ref.shape) != tuple(img.shape):
            return {"error": f"shape {tuple(img.shape)} vs {tuple(ref.shape)}"}
        diff = (ref.to(torch.int16) - img.to(torch.int16)).abs()
        worst = max(worst, int(diff.max()))
        total += float(diff.sum())
        over_one += int((diff > 1).sum())
        values += diff.numel()
    return {
        "max_abs": worst,
        "mean_abs": round(total / values, 5),
        "share_over_1": round(over_one / values, 6),
    }


def _decoders(device) -> dict[str, Any]:
    """name -> function(list of JPEG bytes) -> list of uint8 (3, H, W) CPU tensors."""
    import numpy as np
    import simplejpeg
    import torch

    from energon import DeviceImageDecoder
    from energon.decode import IMAGE_MODES, decode_image

    def cpu(jpegs):
        return [decode_image(d, IMAGE_MODES["torchrgb8"]) for d in jpegs]

    def fast_upsample(jpegs):
        decode = simplejpeg.decode_jpeg
        return [
            torch.from_numpy(np.ascontiguousarray(decode(d, "RGB", False, True).transpose(2, 0, 1)))
            for d in jpegs
        ]

    decoders = {"cpu": cpu, "libjpeg_fast_upsample": fast_upsample}
    if device.type == "cuda":
        gpu = DeviceImageDecoder(device)

        def nvjpeg(jpegs):
            before = gpu.cpu_fallbacks
            decoded = [p.cpu() for p in gpu.decode(jpegs)]
            if gpu.cpu_fallbacks != before:  # then the comparison would not be nvJPEG's
                raise RuntimeError(
                    f"{gpu.cpu_fallbacks - before} of {len(jpegs)} images fell back to the CPU: "
                    f"{gpu.device_error}"
                )
            return decoded

        decoders["nvjpeg"] = nvjpeg
    try:
        from torchvision.io import ImageReadMode, decode_jpeg

        def torchvision_cpu(jpegs):
            tensors = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in jpegs]
            return [decode_jpeg(t, mode=ImageReadMode.RGB) for t in tensors]

        decoders["torchvision_cpu"] = torchvision_cpu
    except ImportError:
        pass
    return decoders


def pixels(args: argparse.Namespace) -> dict[str, Any]:
    device = _device()
    out: dict[str, Any] = {"device": str(device)}
    if device.type != "cuda":
        out["skipped"] = "no CUDA device: nvJPEG not compared (CPU decoders only)"
    decoders = _decoders(device)
    for case, jpegs in pixel_cases(dataset_jpegs(args.dataset, args.pixels)).items():
        try:
            decoded = {name: decode(jpegs) for name, decode in decoders.items()}
            row = {"images": len(jpegs)}
            for name, images in decoded.items():
                if name != "cpu":
                    row[f"{name}_vs_cpu"] = _difference(decoded["cpu"], images)
            if "nvjpeg" in decoded:
                fast = decoded["libjpeg_fast_upsample"]
                row["nvjpeg_vs_libjpeg_fast_upsample"] = _difference(fast, decoded["nvjpeg"])
        except Exception as exc:  # one case failing must not lose the others
            row = {"error": f"{type(exc).__name__}: {exc}"}
        out[case] = row
        stamp(f"pixels {case}: {json.dumps(row)}")
        record(args.json, "gpu_decode_pixels", out)
    return out


def raw_rates(args: argparse.Namespace, jpegs: list[bytes], seconds: float) -> dict[str, Any]:
    """Decode-only rates on the same JPEGs, no loader: the CPU path on one thread, and nvJPEG in
    batches of 32 (where CUDA is), with this process's CPU seconds per image (nvJPEG parses and
    Huffman-decodes on the CPU)."""
    import torch

    from energon import DeviceImageDecoder
    from energon.decode import IMAGE_MODES, decode_image

    batches = [jpegs[i : i + BATCH_SIZE] for i in range(0, len(jpegs), BATCH_SIZE)]

    def rate(decode_batch, finish=lambda: None) -> dict[str, float]:
        decode_batch(batches[0])  # warm-up (CUDA context, nvJPEG handles)
        finish()
        images, wall, cpu = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - wall < seconds:
            for batch in batches:
                decode_batch(batch)
                images += len(batch)
        finish()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        return {
            "images_per_s": round(images / wall, 1),
            "cpu_ms_per_image": round(1e3 * cpu / images, 4),
        }

    mode = IMAGE_MODES["torchrgb8"]
    out = {"cpu_torchrgb8_1_thread": rate(lambda batch: [decode_image(d, mode) for d in batch])}
    if torch.cuda.is_available():
        decoder = DeviceImageDecoder("cuda")
        out["nvjpeg_batch32"] = rate(decoder, torch.cuda.synchronize)
        out["nvjpeg_batch32"]["cpu_fallbacks"] = decoder.cpu_fallbacks
    stamp(f"raw rates: {json.dumps(out)}")
    record(args.json, "gpu_decode_raw", out)
    return out


def cuda_checks(args: argparse.Namespace, jpegs: list[bytes]) -> dict[str, Any]:
    """What tests/decode/test_device_decode.py and test_normalize.py assert on CUDA, run here
    (the GPU machine has no pytest): mixed formats through DeviceImageDecoder, and
    ImageNormalizer on the device against the float path."""
    import torch
    from PIL import Image

    from energon import DeviceImageDecoder, ImageNormalizer

    if not torch.cuda.is_available():
        record(args.json, "cuda_checks", {"skipped": "no CUDA device"})
        return {"skipped": "no CUDA device"}
    out: dict[str, Any] = {}

    def encode(image, format, **options):
        buffer = io.BytesIO()
        image.save(buffer, format=format, **options)
        return buffer.getvalue()

    photo = Image.open(io.BytesIO(jpegs[0]))
    mixed = [
        jpegs[0],
        encode(photo, "JPEG", quality=90, progressive=True),
        encode(photo.convert("L"), "JPEG", quality=90),
        encode(photo, "PNG"),
        encode(photo.convert("CMYK"), "JPEG", quality=90),
    ]
    gpu = DeviceImageDecoder("cuda")
    on_gpu = gpu(mixed).cpu()
    on_cpu = DeviceImageDecoder("cpu")(mixed)
    difference = (on_gpu.to(torch.int16) - on_cpu.to(torch.int16)).abs()
    out["mixed_batch"] = {
        "same_shape": on_gpu.shape == on_cpu.shape,
        "device_images": gpu.device_images,  # expected 3
        "cpu_fallbacks": gpu.cpu_fallbacks,  # expected 2 (PNG, CMYK)
        "device_error": gpu.device_error,
        "jpeg_slots_mean_abs": round(float(difference[:3].float().mean()), 4),
        "cpu_slots_equal": bool(torch.equal(on_gpu[3:], on_cpu[3:])),
    }
    values = (
        torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16).expand(2, 3, 16, 16).contiguous()
    )
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    unit = ImageNormalizer()(values.cuda()).cpu()
    normalized = ImageNormalizer(MEAN, STD)(values.cuda())
    float_on_device = (values.float() / 255).cuda()  # the float path's values (CPU divides exactly)
    expected = (float_on_device - mean.cuda()) / std.cuda()
    out["normalizer"] = {
        "unit_equals_float_path": bool(torch.equal(unit, values.float() / 255)),
        "plain_cuda_division_differs": int((values.cuda().float() / 255).cpu().ne(unit).sum()),
        "normalized_equals_per_pixel_on_device": bool(torch.equal(normalized, expected)),
    }
    stamp(f"cuda checks: {json.dumps(out)}")
    record(args.json, "cuda_checks", out)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default=None, help="a prepared captioning dataset")
    parser.add_argument("--pixels", type=int, default=0, help="compare pixels of N JPEGs")
    parser.add_argument("--workers", default="", help="worker counts for the throughput runs")
    parser.add_argument("--modes", default="cpu_uint8,device")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per run")
    parser.add_argument("--warm", type=float, default=1.5, help="warm-up seconds per run")
    parser.add_argument("--json", default=None, help="record results in this JSON file")
    parser.add_argument("--deadline", type=float, default=None, help="time.time() to stop by")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return
    if not args.dataset:
        raise SystemExit("--dataset PATH (a prepared captioning dataset) is needed")
    if args.pixels:
        pixels(args)
        jpegs = dataset_jpegs(args.dataset, 4 * args.pixels)
        try:
            cuda_checks(args, jpegs)
        except Exception as exc:  # recorded, and the rates still run
            record(args.json, "cuda_checks", {"error": f"{type(exc).__name__}: {exc}"})
        raw_rates(args, jpegs, args.seconds)
    if args.workers:
        throughput(args)
    stamp(f"done at {time.strftime('%H:%M:%S')}")


if __name__ == "__main__":
    main()
