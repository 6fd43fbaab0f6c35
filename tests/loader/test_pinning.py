"""Pinned memory with workers (CUDA): the main process pins only the items that hold
something to pin, decided in the worker (``ItemMeta.pin``); text batches pass untouched, batches
with tensors are pinned exactly as torch would, and nothing changes without CUDA."""

from __future__ import annotations

import dataclasses
import pickle
from collections import OrderedDict, namedtuple

import pytest
import torch

import energon.loader.workers.messages as messages
from energon import DefaultTaskEncoder, WorkerConfig, get_loader, get_train_dataset
from energon.loader.workers.messages import Group, collate_group
from energon.pipeline.executor import ItemMeta
from energon.samples.base import needs_pinning

Pair = namedtuple("Pair", "a b")


@dataclasses.dataclass
class OwnPinning:
    """A user's batch class that pins in its own way (torch calls its ``pin_memory``)."""

    label: str

    def pin_memory(self):
        return self


class HasPinMethod:
    def pin_memory(self):
        return self


def _batches(path, num_workers: int, count: int, task_encoder=None) -> list:
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    kwargs = {"task_encoder": task_encoder} if task_encoder is not None else {}
    ds = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=4,
        shuffle_buffer_size=5,
        max_samples_per_sequence=5,
        **kwargs,
    )
    return [batch for _, batch in zip(range(count), get_loader(ds))]


def test_needs_pinning_finds_tensors_anywhere_and_nothing_in_text(text_ds):
    (text_batch,) = _batches(text_ds, 0, 1)
    assert not needs_pinning(text_batch)  # keys, texts, restore keys, source infos, subflavors
    assert not needs_pinning({"a": ["x", (1, 2.0, None, b"y")], "b": Pair("s", 3)})
    tensor = torch.zeros(2)
    assert needs_pinning(tensor)
    assert needs_pinning({"a": [("x", tensor)]})
    assert needs_pinning(Pair("s", tensor))
    assert needs_pinning(OrderedDict(a="x", t=tensor)) and not needs_pinning(OrderedDict(a="x"))
    assert needs_pinning(dataclasses.replace(text_batch, text=[tensor]))
    assert needs_pinning(dataclasses.replace(text_batch, __subflavors__=[{"t": tensor}]))
    # restore keys and source infos are the loader's own plain values: not looked into
    assert not needs_pinning(dataclasses.replace(text_batch, __restore_key__=("x", tensor)))
    assert needs_pinning(OwnPinning("x")), "a class's own pin_memory may do anything"
    assert needs_pinning(HasPinMethod())
    assert not needs_pinning(object())


class TokenTensors(DefaultTaskEncoder):
    """Batches that hold small tensors (token ids) besides the texts."""

    def encode_batch(self, batch):
        return {"keys": batch.__key__, "ids": torch.tensor([len(t) for t in batch.text])}


def _items(path, task_encoder=None) -> list:
    """Batches as a worker hands them to ``collate_group``: (value, meta)."""
    return [
        (value, ItemMeta(position=i, stream=0, snapshot={}))
        for i, value in enumerate(_batches(path, 0, 3, task_encoder))
    ]


@pytest.mark.parametrize("pinned", [True, False])
def test_groups_pin_only_items_that_hold_tensors(text_ds, monkeypatch, pinned):
    """The worker marks the items (``collate_group``), the group travels pickled, and the main
    process (``Group.pin_memory``) hands only the marked ones to torch's pin_memory."""
    pinned_values = []

    def fake_pin(value):  # what torch.utils.data's pin_memory would do, without CUDA
        pinned_values.append(value)
        return {**value, "ids": value["ids"].clone()}

    monkeypatch.setattr(messages, "_torch_pin_memory", fake_pin)
    text_items = _items(text_ds)
    tensor_items = _items(text_ds, TokenTensors())
    group = Group(1, False, [text_items[0], tensor_items[0], text_items[1], tensor_items[1]])
    collate_group(None, pinned, group)
    assert [meta.pin for _, meta in group.items] == [False, pinned, False, pinned]

    arrived = pickle.loads(pickle.dumps(group))  # the way to the main process
    assert (arrived.worker, arrived.last) == (1, False)
    before = [value for value, _ in arrived.items]
    assert arrived.pin_memory() is arrived
    after = [value for value, _ in arrived.items]
    assert after[0] is before[0] and after[2] is before[2], "text batches are not rebuilt"
    if pinned:
        assert pinned_values == [before[1], before[3]]
        assert after[1] is not before[1] and torch.equal(after[1]["ids"], before[1]["ids"])
    else:
        assert pinned_values == [] and after == before
    assert [meta.position for _, meta in arrived.items] == [0, 0, 1, 1]


def test_group_pinning_keeps_errors_in_place(monkeypatch):
    from torch._utils import ExceptionWrapper

    monkeypatch.setattr(messages, "_torch_pin_memory", lambda value: ["pinned", value])
    try:
        raise ValueError("boom")
    except ValueError:
        error = ExceptionWrapper(where="in DataLoader worker process 0")
    meta = ItemMeta(position=0, stream=0, snapshot={}, pin=True)
    group = Group(0, True, [(torch.ones(1), meta), error])
    group.pin_memory()
    assert group.items[0][0][0] == "pinned" and group.items[1] is error


def _cuda_or_skip(monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # the suite hides GPUs by default
    if not torch.cuda.is_available():
        pytest.skip("pinned memory needs CUDA (checked on a GPU machine)")


def test_with_cuda_workers_pin_tensors_and_leave_text_alone(text_ds, captioning_ds, monkeypatch):
    _cuda_or_skip(monkeypatch)
    tokens = _batches(text_ds, 2, 6, TokenTensors())
    assert all(batch["ids"].is_pinned() for batch in tokens)
    texts = _batches(text_ds, 2, 6)
    images = _batches(captioning_ds, 2, 6)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert [b["keys"] for b in tokens] == [
        b["keys"] for b in _batches(text_ds, 2, 6, TokenTensors())
    ]
    unpinned_texts = _batches(text_ds, 2, 6)
    for a, b in zip(texts, unpinned_texts):
        assert a == b and type(a.__restore_key__) is type(b.__restore_key__)
    for a, b in zip(images, _batches(captioning_ds, 2, 6)):
        assert a.__key__ == b.__key__ and torch.equal(a.image, b.image)
