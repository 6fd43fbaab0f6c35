"""Batching helpers: stacking, pad-stacking, generic collation and concatenation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from energon.samples import Batch, CaptioningSample
from energon.samples.collate import (
    batch_list,
    batch_pad_stack,
    batch_stack,
    concat_pad,
    generic_batch,
    generic_concat,
    homogeneous_concat_mix,
)


def test_batch_stack_and_list():
    items = [torch.full((2, 3), float(i)) for i in range(4)]
    stacked = batch_stack(items)
    assert stacked.shape == (4, 2, 3) and torch.equal(stacked[2], items[2])
    assert batch_list(("a", "b")) == ["a", "b"]


def test_pad_stack_pads_with_zeros_and_keeps_dtype():
    a = torch.ones(2, 5, dtype=torch.int64)
    b = torch.full((4, 3), 7, dtype=torch.int64)
    out = batch_pad_stack([a, b])
    assert out.shape == (2, 4, 5) and out.dtype == torch.int64
    assert torch.equal(out[0, :2, :5], a) and out[0, 2:].sum() == 0
    assert torch.equal(out[1, :4, :3], b) and out[1, :, 3:].sum() == 0


def test_pad_stack_equal_shapes_equals_stack():
    items = [torch.rand(3, 2) for _ in range(3)]
    assert torch.equal(batch_pad_stack(items), torch.stack(items))


def test_pad_stack_casts_to_first_dtype_and_handles_scalars():
    out = batch_pad_stack([torch.tensor([1.5]), torch.tensor([2], dtype=torch.int32)])
    assert out.dtype == torch.float32 and out.tolist() == [[1.5], [2.0]]
    assert batch_pad_stack([torch.tensor(1), torch.tensor(2)]).tolist() == [1, 2]


def test_pad_stack_rejects_mixed_ranks_and_empty():
    with pytest.raises(ValueError, match="different ranks"):
        batch_pad_stack([torch.zeros(2), torch.zeros(2, 2)])
    with pytest.raises(ValueError):
        batch_pad_stack([])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=5))
def test_pad_stack_property_every_item_in_its_corner_rest_zero(shapes):
    items = [torch.arange(1, h * w + 1, dtype=torch.float32).reshape(h, w) for h, w in shapes]
    out = batch_pad_stack(items)
    assert out.shape == (len(items), max(h for h, _ in shapes), max(w for _, w in shapes))
    for i, (h, w) in enumerate(shapes):
        assert torch.equal(out[i, :h, :w], items[i])
        assert out[i].sum() == items[i].sum()


class Pair(NamedTuple):
    x: torch.Tensor
    name: str


@dataclass
class Plain:
    values: torch.Tensor
    label: int


def test_generic_batch_dicts():
    batch = generic_batch([{"t": torch.zeros(2), "s": "a"}, {"t": torch.ones(3), "s": "b"}])
    assert batch["t"].shape == (2, 3) and batch["t"][1].tolist() == [1, 1, 1]
    assert batch["s"] == ["a", "b"]


def test_generic_batch_dataclasses_and_namedtuples():
    plain = generic_batch(
        [Plain(values=torch.ones(1), label=1), Plain(values=torch.ones(2), label=2)]
    )
    assert (
        isinstance(plain, Plain)
        and plain.values.tolist() == [[1, 0], [1, 1]]
        and plain.label == [1, 2]
    )
    pairs = generic_batch([Pair(torch.ones(2), "a"), Pair(torch.zeros(2), "b")])
    assert isinstance(pairs, Pair) and pairs.x.shape == (2, 2) and pairs.name == ["a", "b"]


def test_generic_batch_samples_become_batched_sample_of_same_type():
    samples = [
        CaptioningSample(
            __key__=str(i), __restore_key__=(i,), image=torch.rand(3, 2 + i, 2), caption=f"c{i}"
        )
        for i in range(3)
    ]
    batch = generic_batch(samples)
    assert isinstance(batch, CaptioningSample)
    assert batch.image.shape == (3, 3, 4, 2) and batch.caption == ["c0", "c1", "c2"]
    assert batch.__key__ == ["0", "1", "2"] and batch.__subflavors__ == [None, None, None]


def test_generic_batch_uses_from_samples_of_batch_dataclasses():
    @dataclass
    class Tokens(Batch):
        tokens: torch.Tensor

    parts = [Tokens(__key__=["a"], __restore_key__=(), tokens=torch.ones(1, 2))]
    result = generic_batch(parts * 2)
    assert (
        isinstance(result, Tokens)
        and result.tokens.shape == (2, 1, 2)
        and result.__key__ == [["a"], ["a"]]
    )


def test_generic_batch_other_values_and_empty():
    assert generic_batch([1, 2, 3]) == [1, 2, 3]
    assert generic_batch([]) == []


def test_concat_pad_concatenates_along_batch_dim():
    a = torch.ones(2, 3)
    b = torch.full((1, 5), 2.0)
    out = concat_pad([a, b])
    assert out.shape == (3, 5)
    assert torch.equal(out[:2, :3], a) and out[:2, 3:].sum() == 0 and torch.equal(out[2], b[0])
    assert torch.equal(concat_pad([a, a]), torch.cat([a, a]))
    with pytest.raises(ValueError):
        concat_pad([torch.tensor(1.0)])


def test_generic_concat_joins_batches_field_by_field():
    first = {"t": torch.ones(2, 2), "keys": ["a", "b"], "rk": ("x",)}
    second = {"t": torch.zeros(1, 3), "keys": ["c"], "rk": ("y",)}
    out = generic_concat([first, second])
    # tensors are concatenated; other columns become the list of the batches' values, as
    # Megatron-Energon's generic_concat gives them
    assert out["t"].shape == (3, 3)
    assert out["keys"] == [["a", "b"], ["c"]] and out["rk"] == [("x",), ("y",)]


def test_homogeneous_concat_mix_requires_one_type():
    a = Plain(values=torch.ones(1, 2), label=[1])  # type: ignore[arg-type]
    mixed = homogeneous_concat_mix([a, a])
    assert isinstance(mixed, Plain) and mixed.values.shape == (2, 2) and mixed.label == [[1], [1]]
    with pytest.raises(TypeError, match="one type"):
        homogeneous_concat_mix([a, {"values": torch.ones(1)}])


class _PadStackInWorker(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int):
        items = [torch.full((2, 3), 1.0 + index), torch.full((4, 1), 5.0)]
        out = batch_pad_stack(items)
        return out, out.is_shared(), batch_pad_stack(items[:1] * 2).is_shared()


def test_pad_stack_in_dataloader_worker_allocates_in_shared_memory():
    loader = torch.utils.data.DataLoader(
        _PadStackInWorker(), batch_size=None, num_workers=1, collate_fn=lambda x: x
    )
    results = list(loader)
    assert [(shared, stacked_shared) for _, shared, stacked_shared in results] == [(True, True)] * 2
    out = results[1][0]
    assert out.shape == (2, 4, 3)
    assert out[0, :2, :3].eq(2.0).all() and out[0, 2:].eq(0).all()
    assert out[1, :, :1].eq(5.0).all() and out[1, :, 1:].eq(0).all()
    assert not batch_pad_stack([torch.zeros(1)]).is_shared()
