"""Task encoder hooks in the pipeline: generators, SkipSample, reproducible augmentation, errors."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

from energon import (
    Batch,
    DefaultTaskEncoder,
    FatalSampleError,
    SkipSample,
    TaskEncoder,
    TextSample,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    reraise_exception,
    stateless,
)


@dataclasses.dataclass
class Encoded:
    __key__: str
    __restore_key__: tuple
    text: str
    part: int
    noise: float


@dataclasses.dataclass
class EncodedBatch:
    __key__: list
    __restore_key__: tuple
    text: list
    part: torch.Tensor
    noise: torch.Tensor


class SplittingEncoder(TaskEncoder):
    """Generator hook: every sample yields two halves; samples ending in 7 are skipped."""

    @stateless(restore_seeds=True)
    def encode_sample(self, sample: TextSample):
        if sample.__key__.endswith("7"):
            raise SkipSample()
        for part in range(2):
            yield Encoded(
                __key__=sample.__key__,
                __restore_key__=(),
                text=sample.text[part::2],
                part=part + 100 * (self.current_sample_index % 3),
                noise=float(np.random.rand()) + random.random() + float(torch.rand(())),
            )

    def batch(self, samples):
        return EncodedBatch(
            __key__=[s.__key__ for s in samples],
            __restore_key__=(),
            text=[s.text for s in samples],
            part=torch.tensor([s.part for s in samples]),
            noise=torch.tensor([s.noise for s in samples]),
        )


def loader_for(path, task_encoder, num_workers=0, **kwargs):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    options = dict(batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=5)
    options.update(kwargs)
    return get_savable_loader(
        get_train_dataset(path, worker_config=wc, task_encoder=task_encoder, **options)
    )


def summary(batches):
    return [(tuple(b.__key__), b.part.tolist(), b.noise.tolist()) for b in batches]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_generator_hook_skip_and_seeded_randomness_restore_exactly(text_ds, num_workers):
    loader = loader_for(text_ds, SplittingEncoder(), num_workers=num_workers)
    it = iter(loader)
    first = [next(it) for _ in range(5)]  # 15 outputs: a generator is cut mid-way at some point
    state = loader.save_state_rank()
    expected = summary(next(it) for _ in range(10))
    assert not any(k.endswith("7") for b in first for k in b.__key__)
    restored = loader_for(text_ds, SplittingEncoder(), num_workers=num_workers)
    restored.restore_state_rank(state)
    got = summary(next(iter(restored)) for _ in range(10))
    assert got == expected


def test_restore_seeds_leaves_global_rng_alone_and_is_layout_independent(text_ds):
    torch.manual_seed(3)
    before = torch.rand(2)
    torch.manual_seed(3)
    a = summary(
        next(iter(loader_for(text_ds, SplittingEncoder(), num_streams=2))) for _ in range(4)
    )
    after = torch.rand(2)
    assert torch.equal(before, after)
    b = summary(
        next(iter(loader_for(text_ds, SplittingEncoder(), num_workers=2))) for _ in range(4)
    )
    assert a == b


def test_default_batching_uses_batch_from_samples(text_ds):
    @dataclasses.dataclass
    class TextBatch(Batch):
        text: list

    te = DefaultTaskEncoder(raw_batch_type=TextBatch)
    batch = next(iter(loader_for(text_ds, te)))
    assert isinstance(batch, TextBatch)
    assert len(batch.text) == 3 and len(batch.__key__) == 3


class FailingEncoder(DefaultTaskEncoder):
    def __init__(self, bad_every: int, **kwargs):
        super().__init__(**kwargs)
        self.bad_every = bad_every

    def encode_sample(self, sample):
        if int(sample.__key__.split("_")[1]) % self.bad_every == 0:
            raise ValueError(f"cannot encode {sample.__key__}")
        return sample


def test_hook_errors_skip_and_are_reported(text_val_ds, capsys):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    loader = get_savable_loader(
        get_val_dataset(
            text_val_ds, worker_config=wc, batch_size=None, task_encoder=FailingEncoder(5)
        )
    )
    seen = [s.__key__ for s in loader]
    assert seen and all(int(k.split("_")[1]) % 5 for k in seen)
    err = capsys.readouterr().err
    assert "cannot encode" in err
    assert "in hook 'encode_sample' for sample '000" in err
    assert ".tar" in err, "the shard the failing sample came from is named"


def test_hook_errors_raise_with_reraise_handler(text_val_ds):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0, global_error_handler=reraise_exception)
    loader = get_savable_loader(
        get_val_dataset(
            text_val_ds, worker_config=wc, batch_size=None, task_encoder=FailingEncoder(5)
        )
    )
    with pytest.raises(ValueError, match="cannot encode"):
        list(loader)


class AlwaysFailing(DefaultTaskEncoder):
    @stateless(failure_tolerance=10)
    def encode_sample(self, sample):
        raise ValueError("broken hook")


def test_consecutive_failures_become_fatal(text_val_ds):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0, global_error_handler=lambda *a: None)
    loader = get_savable_loader(
        get_val_dataset(
            text_val_ds, worker_config=wc, batch_size=None, task_encoder=AlwaysFailing()
        )
    )
    with pytest.raises(FatalSampleError, match="in a row"):
        list(loader)


class PrePost(DefaultTaskEncoder):
    """The split encode form: pre runs on every sample, post right before packing (or batching)."""

    def preencode_sample(self, sample):
        return TextSample.derive_from(sample, text="pre:" + sample.text)

    def postencode_sample(self, sample):
        return TextSample.derive_from(sample, text=sample.text + ":post")


class PrePostPacked(PrePost):
    def select_samples_to_pack(self, samples):
        return [samples[i : i + 2] for i in range(0, len(samples), 2)]

    @stateless
    def pack_selected_samples(self, samples):
        return TextSample.derive_from(samples[0], text="|".join(s.text for s in samples))


def test_preencode_and_postencode_hooks(text_ds):
    plain = next(iter(loader_for(text_ds, PrePost(), batch_size=4)))
    assert all(t.startswith("pre:") and t.endswith(":post") for t in plain.text)
    packed = next(iter(loader_for(text_ds, PrePostPacked(), batch_size=2, packing_buffer_size=4)))
    for text in packed.text:
        members = text.split("|")
        assert len(members) == 2 and all(
            m.startswith("pre:") and m.endswith(":post") for m in members
        )


def test_preencode_with_encode_sample_is_an_error(text_ds):
    class Both(PrePost):
        def encode_sample(self, sample):
            return sample

    with pytest.raises(ValueError, match="either encode_sample or preencode_sample"):
        next(iter(loader_for(text_ds, Both())))
