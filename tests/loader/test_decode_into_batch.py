"""Float images decoded straight into the batch (energon.decode.pending): same batches as the
per-sample path, and no PendingImage ever reaches user code."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from energon import (
    DefaultTaskEncoder,
    SampleDecoder,
    WorkerConfig,
    get_loader,
    get_train_dataset,
)
from energon.decode.pending import PendingImage, materialize_pending
from energon.samples.collate import batch_pad_stack
from tests.helpers.datasets import make_captioning_dataset

pytest.importorskip("simplejpeg")


def _batches(path, num_workers: int, count: int, task_encoder=None, batch_size: int = 4):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    kwargs = {"task_encoder": task_encoder} if task_encoder is not None else {}
    ds = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=batch_size,
        shuffle_buffer_size=5,
        max_samples_per_sequence=5,
        **kwargs,
    )
    out = []
    for _, batch in zip(range(count), get_loader(ds)):
        out.append((list(batch.__key__), batch.image.clone()))
    return out


def _decoding(image_decode: str) -> DefaultTaskEncoder:
    encoder = DefaultTaskEncoder()
    encoder.decoder = SampleDecoder(image_decode=image_decode)
    return encoder


@pytest.mark.parametrize(
    ("num_workers", "image_decode", "dtype"),
    [(0, "torchrgb", torch.float32), (2, "torchrgb", torch.float32), (0, "torchrgb8", torch.uint8)]
    + [(2, "torchrgb8", torch.uint8)],
)
def test_batches_equal_the_pillow_path_bit_for_bit(
    captioning_ds, num_workers, image_decode, dtype, monkeypatch
):
    monkeypatch.setattr("energon.memory.buffer_pool.MIN_BYTES", 1024)  # pool the small test images
    monkeypatch.setattr("energon.memory.batch_arena.MIN_BYTES", 1024)
    fast = _batches(captioning_ds, num_workers, 12, _decoding(image_decode))
    monkeypatch.setenv("ENERGON_NO_FAST_JPEG", "1")
    slow = _batches(captioning_ds, num_workers, 12, _decoding(image_decode))
    assert [keys for keys, _ in fast] == [keys for keys, _ in slow]
    for (_, a), (_, b) in zip(fast, slow):
        assert a.dtype == b.dtype == dtype and a.shape == b.shape
        assert torch.equal(a, b)
    padded = [image for _, image in fast if (image == 0).any()]
    assert padded, "the test images differ in size, so some slots are padded"


class SeesSamples(DefaultTaskEncoder):
    """A user hook between loading and batching: it must see ordinary float tensors."""

    def encode_sample(self, sample):
        assert isinstance(sample.image, torch.Tensor) and sample.image.dtype == torch.float32
        return sample


class OwnBatch(DefaultTaskEncoder):
    def batch(self, samples):
        assert all(isinstance(s.image, torch.Tensor) for s in samples)
        return super().batch(samples)


@pytest.mark.parametrize("encoder", [SeesSamples(), OwnBatch()])
def test_user_hooks_see_float_tensors(captioning_ds, encoder):
    fast = _batches(captioning_ds, 0, 6, task_encoder=encoder)
    plain = _batches(captioning_ds, 0, 6)
    for (_, a), (_, b) in zip(fast, plain):
        assert torch.equal(a, b)


def test_unbatched_samples_are_float_tensors(captioning_ds):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_train_dataset(
        captioning_ds,
        worker_config=wc,
        batch_size=None,
        shuffle_buffer_size=5,
        max_samples_per_sequence=5,
    )
    for _, sample in zip(range(5), get_loader(ds)):
        assert isinstance(sample.image, torch.Tensor) and sample.image.dtype == torch.float32


def _pending(height: int, width: int, seed: int) -> PendingImage:
    rng = np.random.default_rng(seed)
    return PendingImage(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def test_pad_stack_of_pending_and_ordinary_images_equals_the_float_path():
    items = [_pending(5, 7, 0), _pending(9, 3, 1), _pending(9, 7, 2)]
    ordinary = torch.rand(3, 4, 8)
    expected = batch_pad_stack([p.materialize() for p in items] + [ordinary])
    mixed = batch_pad_stack([*items, ordinary])
    assert torch.equal(mixed, expected)
    assert mixed.shape == (4, 3, 9, 8)
    reference = torch.from_numpy(items[0].pixels).permute(2, 0, 1).float() / 255
    assert torch.equal(mixed[0, :, :5, :7], reference)
    assert not mixed[0, :, 5:, :].any() and not mixed[0, :, :, 7:].any()


def test_pad_stack_of_uint8_pending_images_equals_the_uint8_path():
    rng = np.random.default_rng(5)
    pixels = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(5, 7), (9, 3), (2, 8)]]
    pending = [PendingImage(p, torch.uint8) for p in pixels]
    stacked = batch_pad_stack(pending)
    assert stacked.dtype == torch.uint8 and stacked.shape == (3, 3, 9, 8)
    expected = batch_pad_stack([torch.from_numpy(p).permute(2, 0, 1).contiguous() for p in pixels])
    assert torch.equal(stacked, expected)
    assert torch.equal(pending[1].materialize(), expected[1, :, :9, :3])
    # mixed with a float image: as if every image had been its own tensor (the first's dtype)
    other = torch.rand(3, 2, 2) * 255
    mixed = batch_pad_stack([*pending, other])
    assert torch.equal(mixed, batch_pad_stack([*(p.materialize() for p in pending), other]))


def test_materialize_pending_reaches_into_containers():
    image = _pending(4, 4, 3)
    value = {"a": [image, "text"], "b": (image, 1), "c": {"d": image}}
    out = materialize_pending(value)
    for item in (out["a"][0], out["b"][0], out["c"]["d"]):
        assert isinstance(item, torch.Tensor) and torch.equal(item, image.materialize())
    assert out["a"][1] == "text" and out["b"][1] == 1


def test_pending_pixels_stay_valid_until_batched(monkeypatch):
    """The pooled pixel buffer of a PendingImage is not handed out again while it is alive."""
    monkeypatch.setattr("energon.memory.buffer_pool.MIN_BYTES", 1024)
    from energon.decode.image import IMAGE_MODES, decode_image, set_images_deferred
    from tests.decode.test_jpeg import _jpeg, _photo_like

    data = [_jpeg(_photo_like(40, 30, seed=s)) for s in range(6)]
    previous = set_images_deferred(True)
    try:
        pending = [decode_image(d, IMAGE_MODES["torchrgb"]) for d in data]
        assert all(isinstance(p, PendingImage) for p in pending)
        gc.collect()
        again = [decode_image(d, IMAGE_MODES["torchrgb"]) for d in data]  # may reuse free buffers
    finally:
        set_images_deferred(previous)
    for a, b in zip(pending, again):
        assert a.pixels.ctypes.data != b.pixels.ctypes.data
        assert np.array_equal(a.pixels, b.pixels)


def test_a_sample_loader_sees_float_tensors(tmp_path):
    root = make_captioning_dataset(tmp_path / "ds", num_samples=12, num_shards=1)
    (root / ".nv-meta" / "sample_loader.py").write_text(
        "import torch\n"
        "def sample_loader(raw):\n"
        "    assert isinstance(raw['jpg'], torch.Tensor), type(raw['jpg'])\n"
        "    return dict(image=raw['jpg'], caption=raw['txt'])\n"
        "def part_filter(part):\n"
        "    return part in ('jpg', 'txt')\n"
    )
    (root / ".nv-meta" / "dataset.yaml").write_text(
        "sample_type: {__module__: megatron.energon, __class__: CaptioningSample}\n"
        "sample_loader: sample_loader.py:sample_loader\n"
        "part_filter: sample_loader.py:part_filter\n"
    )
    batches = _batches(root, 0, 3)
    assert len(batches) == 3 and all(image.dtype == torch.float32 for _, image in batches)


def test_batches_are_searched_for_pending_images_only_while_some_exist(
    captioning_ds, text_ds, monkeypatch
):
    """Looking through every batch for PendingImages costs text batches (nested restore keys,
    lists of strings) a third of their making; it happens only while a PendingImage exists."""
    from energon.pipeline import stages

    searched = []
    search = stages.materialize_pending

    def counting(value):
        searched.append(type(value).__name__)
        return search(value)

    monkeypatch.setattr(stages, "materialize_pending", counting)
    gc.collect()
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    for path, expect_search in ((text_ds, False), (captioning_ds, True)):
        searched.clear()
        ds = get_train_dataset(
            path, worker_config=wc, batch_size=4, shuffle_buffer_size=5, max_samples_per_sequence=5
        )
        batches = [batch for _, batch in zip(range(5), get_loader(ds))]
        assert len(batches) == 5
        assert bool(searched) == expect_search, (path, searched)
        if expect_search:
            assert all(batch.image.dtype == torch.float32 for batch in batches)
