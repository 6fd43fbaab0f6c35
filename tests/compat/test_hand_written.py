"""Hand-written datasets (``SavableDataset(worker_config)`` subclasses with their own ``__iter__``):
what energon adds to the reference's behaviour (compared side by side in programs_hand_written.py):
clear errors for states that are not plain data, for a state of another class and for a restore
under another number of workers; the by-hand position of energon's own datasets."""

from __future__ import annotations

import json

import pytest

from energon import WorkerConfig, get_savable_loader, get_val_dataset
from energon.errors import StateError
from energon.loader.savable_dataset import SavableDataset
from tests.helpers.datasets import make_text_dataset

pytestmark = pytest.mark.compat


@pytest.fixture(scope="module")
def text20(tmp_path_factory):
    return make_text_dataset(tmp_path_factory.mktemp("text20"), num_samples=20, num_shards=2)


class Numbers(SavableDataset):
    _savable_fields = ("_next", "_extra")

    def __init__(self, n: int, worker_config: WorkerConfig, extra: object = None) -> None:
        super().__init__(worker_config)
        self.n = n
        self._extra = extra
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._next = 0

    def len_worker(self, worker_idx: int | None = None) -> int:
        return self.n

    def __len__(self) -> int:
        return self.len_rank()

    def worker_has_samples(self) -> bool:
        return True

    def __iter__(self):
        worker = self.worker_config.rank_worker_id()
        while self._next < self.n:
            self._next += 1
            yield (worker, self._next - 1)

    def config(self) -> dict:
        return {"n": self.n}


def config(workers: int = 0) -> WorkerConfig:
    return WorkerConfig(rank=0, world_size=1, num_workers=workers)


def test_each_stream_is_one_worker_and_the_state_is_plain_data():
    loader = get_savable_loader(Numbers(3, config(2)))
    items = list(loader)
    # each worker iterates its own copy, round-robin as torch's workers deliver
    assert items == [[0, 0], [1, 0], [0, 1], [1, 1], [0, 2], [1, 2]]
    state = loader.save_state_rank()
    json.dumps(state)  # plain data throughout (a TypeError otherwise)


def test_a_field_that_is_not_plain_data_is_named():
    loader = get_savable_loader(Numbers(3, config(), extra=object()))
    with pytest.raises(TypeError, match=r"Numbers.save_state\(\)\['_extra'\] is a object"):
        list(loader)


def test_restore_state_refuses_another_class_and_missing_fields():
    dataset = Numbers(3, config())
    with pytest.raises(StateError, match="saved by Other, not by Numbers"):
        dataset.restore_state({"__class__": "Other", "_next": 1, "_extra": None})
    with pytest.raises(StateError, match="no field '_extra'"):
        dataset.restore_state({"__class__": "Numbers", "_next": 1})


def test_a_wrapper_refuses_a_state_of_another_class_before_restoring_its_children():
    from energon.compat.wrappers.base import BaseWrapperDataset

    class Tag(BaseWrapperDataset):
        _savable_fields = ("_seen",)

        def __iter__(self):
            yield from self.dataset

    inner = Numbers(3, config())
    wrapper = Tag(inner, worker_config=config())
    state = {
        "__class__": "Other",
        "_seen": 1,
        "datasets": [{"__class__": "Numbers", "_next": 2, "_extra": None}],
    }
    with pytest.raises(StateError, match="saved by Other, not by Tag"):
        wrapper.restore_state(state)
    assert inner._next == 0  # nothing restored from a state that is refused
    state["__class__"] = "Tag"
    wrapper.restore_state(state)
    assert (wrapper._seen, inner._next) == (1, 2)


def test_a_state_needs_the_same_workers():
    loader = get_savable_loader(Numbers(3, config(2)))
    it = iter(loader)
    next(it)
    state = loader.save_state_rank()
    other = get_savable_loader(Numbers(3, config(1)))
    with pytest.raises(StateError, match="logical streams"):
        other.restore_state_rank(state)


def test_energon_datasets_continue_where_iteration_by_hand_stopped(text20):
    def dataset():
        return get_val_dataset(text20, split_part="train", batch_size=4, worker_config=config())

    whole = [b.__key__ for b in dataset()]
    first = dataset()
    it = iter(first)
    head = [next(it).__key__ for _ in range(3)]
    state = json.loads(json.dumps(first.save_state()))
    second = dataset()
    second.restore_state(state)
    assert head + [b.__key__ for b in second] == whole
    second.reset_state_deep()
    assert [b.__key__ for b in second] == whole


def test_a_torch_dataloader_over_a_dataset_gives_each_worker_its_share(text20):
    """Each of torch's workers iterates its own share (not the whole rank's items each)."""
    import torch.utils.data

    dataset = get_val_dataset(text20, split_part="train", batch_size=4, worker_config=config(2))
    whole = sorted(k for b in get_savable_loader(dataset) for k in b.__key__)
    torch_loader = torch.utils.data.DataLoader(dataset, num_workers=2, batch_size=None)
    got = [k for b in torch_loader for k in b.__key__]
    assert sorted(got) == whole and len(whole) == 20
