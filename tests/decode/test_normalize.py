"""uint8 batches made float after the copy to the device (energon.decode.normalize): the values
of the float path exactly, on real JPEG batches from the loader."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from energon import (
    DefaultTaskEncoder,
    ImageNormalizer,
    SampleDecoder,
    WorkerConfig,
    get_loader,
    get_train_dataset,
    normalize_images,
)

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _image_batches(path, image_decode: str, count: int = 6) -> list[torch.Tensor]:
    encoder = DefaultTaskEncoder()
    encoder.decoder = SampleDecoder(image_decode=image_decode)
    dataset = get_train_dataset(
        path,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        batch_size=8,
        shuffle_buffer_size=5,
        max_samples_per_sequence=5,
        task_encoder=encoder,
    )
    return [batch.image.clone() for _, batch in zip(range(count), get_loader(dataset))]


@pytest.fixture(scope="module")
def float_and_uint8_batches(captioning_ds):
    """The same batches of the real JPEG dataset, as float32 (default) and as uint8."""
    return _image_batches(captioning_ds, "torchrgb"), _image_batches(captioning_ds, "torchrgb8")


def test_uint8_batches_become_the_float_batches_exactly(float_and_uint8_batches):
    floats, uint8s = float_and_uint8_batches
    normalizer = ImageNormalizer()
    assert any((batch == 0).all(dim=1).any() for batch in uint8s), "some slots are padded"
    for as_float, as_uint8 in zip(floats, uint8s):
        assert as_uint8.dtype == torch.uint8 and as_uint8.shape == as_float.shape
        out = normalizer(as_uint8)
        assert out.dtype == torch.float32 and out.shape == as_float.shape
        assert torch.equal(out, as_float)


def test_normalized_equals_normalizing_the_float_batch(float_and_uint8_batches):
    floats, uint8s = float_and_uint8_batches
    normalizer = ImageNormalizer(MEAN, STD)
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    for as_float, as_uint8 in zip(floats, uint8s):
        expected = (as_float - mean) / std
        assert torch.equal(normalizer(as_uint8), expected)
        assert torch.equal(normalizer(as_uint8[0]), expected[0])  # one (C, H, W) image


def test_every_value_is_the_correctly_rounded_division():
    values = torch.arange(256, dtype=torch.uint8)
    expected = np.arange(256, dtype=np.float32) / np.float32(255)
    assert normalize_images(values).numpy().tobytes() == expected.tobytes()
    # a multiplication by 1 / 255 (how torch divides a CUDA tensor by a number) is not it
    assert not np.array_equal(np.arange(256, dtype=np.float32) * np.float32(1 / 255), expected)


def test_one_mean_and_std_for_all_channels_and_other_dtypes():
    images = torch.randint(0, 256, (2, 3, 5, 4), dtype=torch.uint8)
    as_float = normalize_images(images)
    assert torch.equal(normalize_images(images, [0.5], [0.25]), (as_float - 0.5) / 0.25)
    as_bf16 = normalize_images(images, MEAN, STD, dtype=torch.bfloat16)
    normalized = (as_float - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    assert as_bf16.dtype == torch.bfloat16 and torch.equal(as_bf16, normalized.to(torch.bfloat16))


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="uint8 images.*torch.float32"):
        ImageNormalizer()(torch.zeros(3, 2, 2))
    with pytest.raises(ValueError, match="both mean and std"):
        ImageNormalizer(mean=MEAN)
    with pytest.raises(ValueError, match="mean has 3 values and std 2"):
        ImageNormalizer(MEAN, STD[:2])
    with pytest.raises(ValueError, match="do not have 3 channels in dimension -3"):
        ImageNormalizer(MEAN, STD)(torch.zeros(2, 4, 5, 5, dtype=torch.uint8))
    with pytest.raises(ValueError, match="floating-point"):
        ImageNormalizer(dtype=torch.int16)
