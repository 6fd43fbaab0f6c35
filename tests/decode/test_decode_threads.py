"""JPEGs decoded on threads (``decode_threads``): the same batches, errors and states as decoding
on the loader's thread, with real JPEGs, PNGs, CMYK JPEGs and damaged JPEGs mixed in one set."""

from __future__ import annotations

import io
import json
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from energon import (
    DefaultTaskEncoder,
    ErrorBudget,
    SampleDecoder,
    WorkerConfig,
    get_loader,
    get_train_dataset,
    get_val_dataset,
)
from energon.decode.threads import default_decode_threads, run_on_threads
from energon.prepare.dataset import prepare_dataset
from tests.helpers.datasets import CAPTIONING_YAML
from tests.helpers.tarfiles import write_tar

pytest.importorskip("simplejpeg")

SAMPLES = 64
PNG_EVERY, CMYK_EVERY, DAMAGED_EVERY = 7, 11, 9


def _image_bytes(key: int) -> bytes:
    """The image of sample ``key``: mostly JPEGs of varying sizes; some PNGs, CMYK JPEGs (both
    decoded by Pillow) and truncated JPEGs (a decode error)."""
    rng = np.random.default_rng(key)
    height, width = 20 + (key * 7) % 37, 18 + (key * 5) % 41
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    image = Image.fromarray(pixels, "RGB")
    buffer = io.BytesIO()
    if key % PNG_EVERY == 3:
        image.save(buffer, format="PNG")
    elif key % CMYK_EVERY == 5:
        image.convert("CMYK").save(buffer, format="JPEG", quality=90)
    else:
        image.save(buffer, format="JPEG", quality=85)
    data = buffer.getvalue()
    return data[: len(data) // 2] if key % DAMAGED_EVERY == 4 else data


@pytest.fixture(scope="module")
def mixed_ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    for shard in range(2):
        keys = range(shard * SAMPLES // 2, (shard + 1) * SAMPLES // 2)
        members = []
        for key in keys:
            members.append((f"{key:06d}.jpg", _image_bytes(key)))
            members.append((f"{key:06d}.txt", f"caption {key}".encode()))
        write_tar(root / "parts" / f"data-{shard}.tar", members)
    prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False, num_workers=1)
    (root / ".nv-meta" / "dataset.yaml").write_text(CAPTIONING_YAML)
    return root


def _encoder(image_decode: str) -> DefaultTaskEncoder:
    encoder = DefaultTaskEncoder()
    encoder.decoder = SampleDecoder(image_decode=image_decode)
    return encoder


def _run(path, threads: int, batches: int, image_decode: str = "torchrgb"):
    """Keys and images of ``batches`` batches, the errors logged, and the state after them."""
    logged: list[str] = []

    def handler(exc, sample, sources):
        logged.append(f"{type(exc).__name__}: {exc}")

    wc = WorkerConfig(rank=0, world_size=1, num_workers=0, global_error_handler=handler)
    ds = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=6,
        shuffle_buffer_size=10,
        max_samples_per_sequence=8,
        task_encoder=_encoder(image_decode),
        decode_threads=threads,
        error_budget=ErrorBudget(window=10),
    )
    loader = get_loader(ds)
    out = []
    for _, batch in zip(range(batches), loader):
        out.append((list(batch.__key__), batch.image.clone()))
    return out, logged, json.dumps(loader.save_state_rank(), sort_keys=True, default=str)


def _spy_on_decodes(monkeypatch) -> list[str]:
    """Names of the threads that run the fast-path decodes handed to threads."""
    from energon.decode import image

    names: list[str] = []
    decode_into = image._decode_into

    def spy(pending, data):
        names.append(threading.current_thread().name)
        return decode_into(pending, data)

    monkeypatch.setattr(image, "_decode_into", spy)
    return names


@pytest.mark.parametrize("image_decode", ["torchrgb", "torchrgb8"])
def test_threads_give_the_same_batches_errors_and_state(mixed_ds, image_decode, monkeypatch):
    monkeypatch.setattr("energon.memory.buffer_pool.MIN_BYTES", 1024)  # pool the small images
    decoded_on = _spy_on_decodes(monkeypatch)
    serial, serial_errors, serial_state = _run(mixed_ds, 1, 14, image_decode)
    assert decoded_on == []
    threaded, threaded_errors, threaded_state = _run(mixed_ds, 3, 14, image_decode)
    # the JPEGs went to the decode threads
    assert len(decoded_on) > 50 and all(n.startswith("energon-decode") for n in decoded_on)
    assert [keys for keys, _ in threaded] == [keys for keys, _ in serial]
    for (_, a), (_, b) in zip(threaded, serial):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    # the damaged JPEGs were skipped, with Pillow's error naming shard, key and offset
    assert serial_errors and threaded_errors == serial_errors
    assert all("truncated" in e and "data-" in e and "byte offset" in e for e in serial_errors)
    # the error account (counts, windows, examples) and every other part of the state agree
    assert threaded_state == serial_state
    assert '"failed"' in serial_state or "SampleReadError" in serial_state


def test_restoring_a_threaded_state_without_threads_continues_the_same(mixed_ds, monkeypatch):
    logged: list[str] = []
    wc = WorkerConfig(
        rank=0, world_size=1, num_workers=0, global_error_handler=lambda e, *_: logged.append(e)
    )

    def loader(threads):
        ds = get_train_dataset(
            mixed_ds,
            worker_config=wc,
            batch_size=5,
            shuffle_buffer_size=10,
            max_samples_per_sequence=8,
            decode_threads=threads,
        )
        return get_loader(ds)

    decoded_on = _spy_on_decodes(monkeypatch)
    first = loader(4)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.save_state_rank()
    expected = [list(next(it).__key__) for _ in range(6)]
    threaded_decodes = len(decoded_on)
    assert threaded_decodes > 0
    resumed = loader(1)
    resumed.restore_state_rank(state)
    assert [list(b.__key__) for _, b in zip(range(6), resumed)] == expected
    assert len(decoded_on) == threaded_decodes  # the resumed loader decoded on its own thread


def test_validation_pass_is_complete_and_equal(mixed_ds):
    def keys(threads):
        wc = WorkerConfig(rank=0, world_size=1, num_workers=0, global_error_handler=lambda *a: 0)
        ds = get_val_dataset(
            mixed_ds, split_part="train", worker_config=wc, batch_size=7, decode_threads=threads
        )
        return [list(batch.__key__) for batch in get_loader(ds)]

    serial, threaded = keys(1), keys(3)
    assert threaded == serial
    damaged = sum(1 for key in range(SAMPLES) if key % DAMAGED_EVERY == 4)
    assert sum(map(len, serial)) == SAMPLES - damaged


def test_text_sets_load_the_same_with_threads(text_ds):
    def keys_and_texts(threads):
        wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
        ds = get_train_dataset(
            text_ds,
            worker_config=wc,
            batch_size=4,
            shuffle_buffer_size=10,
            max_samples_per_sequence=5,
            decode_threads=threads,
        )
        return [(list(b.__key__), list(b.text)) for _, b in zip(range(12), get_loader(ds))]

    # (a window with nothing to hand to threads switches the load stage back after 8 batches)
    assert keys_and_texts(3) == keys_and_texts(1)


def test_default_threads(monkeypatch):
    monkeypatch.delenv("ENERGON_DECODE_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    assert default_decode_threads(0) == 4  # a process loading by itself: up to 4
    assert default_decode_threads(2) == 1  # workers already decode in parallel
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    assert default_decode_threads(0) == 1
    monkeypatch.setenv("ENERGON_DECODE_THREADS", "3")
    assert default_decode_threads(2) == 3
    monkeypatch.setenv("ENERGON_DECODE_THREADS", "zero")
    with pytest.raises(ValueError, match="ENERGON_DECODE_THREADS"):
        default_decode_threads(0)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_thread_counts_are_refused(captioning_ds, bad):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    with pytest.raises(ValueError, match="decode_threads must be an integer >= 1"):
        get_train_dataset(
            captioning_ds,
            worker_config=wc,
            batch_size=4,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            decode_threads=bad,
        )


def test_run_on_threads_runs_every_item_once_and_raises_the_error():
    seen: list[int] = []
    lock = threading.Lock()

    def work(item: int) -> None:
        with lock:
            seen.append(item)

    run_on_threads(3, work, list(range(10)))
    assert sorted(seen) == list(range(10))

    def fail_on_seven(item: int) -> None:
        if item == 7:
            raise KeyError(item)

    with pytest.raises(KeyError):
        run_on_threads(3, fail_on_seven, list(range(10)))


@pytest.mark.parametrize(("num_workers", "threads", "expected"), [(0, 3, 3), (2, None, 1)])
def test_the_loader_config_names_the_thread_count(
    captioning_ds, num_workers, threads, expected, monkeypatch
):
    monkeypatch.delenv("ENERGON_DECODE_THREADS", raising=False)
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    extra = {} if threads is None else {"decode_threads": threads}
    ds = get_train_dataset(
        captioning_ds,
        worker_config=wc,
        batch_size=4,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        **extra,
    )
    assert get_loader(ds).config()["decode_threads"] == expected
