"""Validation is exactly-once whatever the task encoder does, ranks stay even, and every filler is
flagged in ``__padding__`` (issue 14, points 1 and 2).

Encoders that multiply samples (generator hooks), skip them (``SkipSample``), pack or group them make
the pass length data-dependent; with real ``torch.distributed`` ranks the loader agrees the length
step by step, and a training loop that runs a collective every step does not hang.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist

from energon import (
    Batch,
    DefaultTaskEncoder,
    SkipSample,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_val_dataset,
    is_padding,
)
from energon.errors import FatalSampleError, PaddingError
from energon.loader import evenness
from tests.helpers.distributed import run_ranks

NUM_VAL = 40  # text_val_ds: 40 validation samples


# -- encoders -------------------------------------------------------------------------------------


class Twice(DefaultTaskEncoder):
    """Two outputs per sample (a generator hook)."""

    def encode_sample(self, sample):
        for part in ("a", "b"):
            yield {"__key__": f"{sample.__key__}/{part}", "text": sample.text}


class SkipThirds(DefaultTaskEncoder):
    """Drops every sample whose key ends in a multiple of 3 (a plain function: counts look planned)."""

    def encode_sample(self, sample):
        if int(sample.__key__[-1]) % 3 == 0:
            raise SkipSample()
        return {"__key__": sample.__key__, "text": sample.text}


class TwiceAndSkip(DefaultTaskEncoder):
    """A generator that yields 0, 1 or 2 outputs and sometimes skips."""

    def encode_sample(self, sample):
        digit = int(sample.__key__[-1])
        if digit % 4 == 0:
            raise SkipSample()
        yield {"__key__": f"{sample.__key__}/a", "text": sample.text}
        if digit % 2:
            yield {"__key__": f"{sample.__key__}/b", "text": sample.text}


class PackThrees(DefaultTaskEncoder):
    """Packs up to three consecutive samples into one; every sample lands in a pack."""

    def select_samples_to_pack(self, samples):
        return [samples[i : i + 3] for i in range(0, len(samples), 3)]

    def pack_selected_samples(self, samples):
        return {"__key__": "+".join(s.__key__ for s in samples), "text": [s.text for s in samples]}


class GroupByLength(DefaultTaskEncoder):
    """Short and long texts in separate batches."""

    def batch_group_criterion(self, sample):
        return ("long", None) if len(sample.text) > 30 else ("short", None)


def expected_outputs(keys, encoder_name):
    """What an encoder yields for the validation samples ``keys`` (its outputs' keys)."""
    out = []
    for key in keys:
        digit = int(key[-1])
        if encoder_name == "Twice":
            out += [f"{key}/a", f"{key}/b"]
        elif encoder_name == "SkipThirds":
            out += [] if digit % 3 == 0 else [key]
        elif encoder_name == "TwiceAndSkip":
            if digit % 4:
                out += [f"{key}/a"] + ([f"{key}/b"] if digit % 2 else [])
        else:
            out.append(key)
    return sorted(out)


ENCODERS = {
    "Twice": (Twice, {}),
    "SkipThirds": (SkipThirds, {}),
    "TwiceAndSkip": (TwiceAndSkip, {}),
    "PackThrees": (PackThrees, {"packing_buffer_size": 7}),
    "GroupByLength": (GroupByLength, {}),
}


def all_val_keys(path):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    return sorted(
        k
        for b in get_loader(get_val_dataset(path, worker_config=wc, batch_size=8))
        for k in b.__key__
    )


def real_entries(batch):
    """The keys of a batch's non-filler entries (packed keys split into their samples)."""
    keys, flags = batch["__key__"], is_padding(batch)
    assert isinstance(flags, list) and len(flags) == len(keys)
    return [part for k, pad in zip(keys, flags) if not pad for part in k.split("+")]


def one_rank_pass(path, rank, world_size, num_workers, encoder_name, batch_size, collective):
    cls, extra = ENCODERS[encoder_name]
    wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
    ds = get_val_dataset(path, worker_config=wc, batch_size=batch_size, task_encoder=cls(), **extra)
    batches = []
    for batch in get_loader(ds):
        if collective:  # a training loop's per-step metric all_reduce
            dist.all_reduce(torch.ones(1))
        batches.append([real_entries(batch), list(is_padding(batch)), len(batch["__key__"])])
    return batches


# -- in one process (no torch.distributed) ---------------------------------------------------------


@pytest.mark.parametrize("encoder_name", list(ENCODERS))
@pytest.mark.parametrize("world_size,num_workers", [(1, 0), (1, 2), (3, 0), (2, 2)])
def test_every_output_once_without_torch_distributed(
    text_val_ds, encoder_name, world_size, num_workers
):
    expected = expected_outputs(all_val_keys(text_val_ds), encoder_name)
    seen = []
    for rank in range(world_size):
        for real, _flags, _size in one_rank_pass(
            text_val_ds, rank, world_size, num_workers, encoder_name, 3, collective=False
        ):
            seen += real
    assert sorted(seen) == expected


@pytest.mark.parametrize("num_workers", [0, 2])
def test_generator_pass_delivers_every_output_once_in_order_on_one_rank(text_val_ds, num_workers):
    batches = one_rank_pass(text_val_ds, 0, 1, num_workers, "Twice", 4, collective=False)
    outputs = [k for real, _, _ in batches for k in real]
    assert len(outputs) == 2 * NUM_VAL and sorted(outputs) == expected_outputs(
        all_val_keys(text_val_ds), "Twice"
    )
    assert all(not any(flags) for _, flags, _ in batches), "a single rank needs no filler"


# -- real torch.distributed ranks (gloo) ------------------------------------------------------------


def _rank_pass(rank, world_size, path, num_workers, encoder_name, batch_size):
    return one_rank_pass(path, rank, world_size, num_workers, encoder_name, batch_size, True)


@pytest.mark.parametrize(
    "encoder_name,world_size,num_workers",
    [
        ("Twice", 2, 0),
        ("Twice", 3, 2),
        ("TwiceAndSkip", 2, 2),
        ("SkipThirds", 3, 0),
        ("PackThrees", 2, 0),
        ("GroupByLength", 3, 2),
    ],
)
def test_ranks_agree_on_data_dependent_passes(text_val_ds, encoder_name, world_size, num_workers):
    """Every output exactly once over all ranks, the same batch count on every rank, fillers only
    where a rank ran out (flagged), and no hang although each step runs a collective."""
    per_rank = run_ranks(world_size, _rank_pass, str(text_val_ds), num_workers, encoder_name, 3)
    lengths = [len(batches) for batches in per_rank]
    assert len(set(lengths)) == 1, f"uneven ranks: {lengths}"
    seen = [k for batches in per_rank for real, _, _ in batches for k in real]
    assert sorted(seen) == expected_outputs(all_val_keys(text_val_ds), encoder_name)
    for batches in per_rank:
        for _real, flags, size in batches:
            assert len(flags) == size
            assert all(flags) or not any(flags), "a batch is either real or a filler"
        if encoder_name != "SkipThirds":  # data-dependent: fillers once the rank ran out
            fillers = [i for i, (_, flags, _) in enumerate(batches) if any(flags)]
            assert fillers == list(range(len(batches) - len(fillers), len(batches)))


def _planned_pass(rank, world_size, path, num_workers):
    wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
    loader = get_loader(get_val_dataset(path, worker_config=wc, batch_size=None))
    items = []
    for sample in loader:
        dist.all_reduce(torch.ones(1))
        items.append([sample.__key__, sample.__padding__])
    return [len(loader), items]


def test_planned_passes_need_no_agreement_and_flag_their_fillers(text_val_ds):
    """40 samples, batch_size None, 3 ranks x 2 workers: the streams of 7 and 6 samples are filled
    to 7 positions; the fillers are flagged, everything else is every sample once."""
    per_rank = run_ranks(3, _planned_pass, str(text_val_ds), 2)
    for length, items in per_rank:
        assert len(items) == length == 14
    real = [key for _, items in per_rank for key, pad in items if not pad]
    assert sorted(real) == all_val_keys(text_val_ds)
    fillers = [key for _, items in per_rank for key, pad in items if pad]
    assert len(fillers) == 3 * 14 - NUM_VAL
    assert all(isinstance(pad, bool) for _, items in per_rank for _, pad in items)


# -- planned passes in one process: skips, padding flags, drop_last -------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skipped_samples_become_flagged_fillers_and_ranks_stay_even(text_val_ds, num_workers):
    """``SkipSample`` in a plain encode_sample: the plan's batch count holds on every rank."""
    expected = expected_outputs(all_val_keys(text_val_ds), "SkipThirds")
    seen, lengths = [], []
    for rank in range(4):
        wc = WorkerConfig(rank=rank, world_size=4, num_workers=num_workers)
        loader = get_loader(
            get_val_dataset(text_val_ds, worker_config=wc, batch_size=1, task_encoder=SkipThirds())
        )
        batches = list(loader)
        lengths.append((len(batches), len(loader)))
        for batch in batches:
            seen += real_entries(batch)
    assert len({n for n, _ in lengths}) == 1 and all(n == planned for n, planned in lengths)
    assert sorted(seen) == expected


@pytest.mark.parametrize("batch_size", [None, 1, 4])
def test_padding_flags_parallel_to_keys_for_typed_samples(text_val_ds, batch_size):
    """TextSample batches (the default batching of a Sample type) and unbatched samples."""
    real, fillers = [], 0
    for rank in range(3):
        wc = WorkerConfig(rank=rank, world_size=3, num_workers=0)
        for item in get_loader(
            get_val_dataset(text_val_ds, worker_config=wc, batch_size=batch_size, num_streams=6)
        ):
            if batch_size is None:
                assert isinstance(item.__padding__, bool)
                keys, flags = [item.__key__], [item.__padding__]
            else:
                keys, flags = item.__key__, item.__padding__
                assert isinstance(flags, list) and len(flags) == len(keys)
            real += [k for k, pad in zip(keys, flags) if not pad]
            fillers += sum(flags)
    assert sorted(real) == all_val_keys(text_val_ds)
    if batch_size == 4:
        assert fillers == 0, "balancing needs no filler when batches hold several samples"
    else:
        assert fillers == 2, "6 streams of 7 and 6 samples: two positions filled"


class TextBatch(Batch):
    text: list[str]


class ToBatchType(DefaultTaskEncoder):
    def batch(self, samples):
        return TextBatch.from_samples(samples)


def test_batch_types_carry_the_flags(text_val_ds):
    wc = WorkerConfig(rank=1, world_size=2, num_workers=0)
    ds = get_val_dataset(
        text_val_ds, worker_config=wc, batch_size=1, task_encoder=ToBatchType(), num_streams=6
    )
    batches = list(get_loader(ds))
    assert all(isinstance(b, TextBatch) and len(b.__padding__) == len(b.__key__) for b in batches)
    assert sum(b.__padding__[0] for b in batches) == 1  # streams 1, 3, 5: 7, 7, 6 samples


def test_drop_last_drops_only_what_cannot_form_full_batches(text_val_ds):
    """3 streams of 14, 13 and 13 samples, batch size 7: stream 0 has two full batches, the others
    one; 7 + 6 + 6 samples are the partial rest. Ranks stay even through flagged full fillers."""
    real, lengths = [], []
    for rank in range(3):
        wc = WorkerConfig(rank=rank, world_size=3, num_workers=0)
        loader = get_loader(
            get_val_dataset(text_val_ds, worker_config=wc, batch_size=7, batch_drop_last=True)
        )
        batches = list(loader)
        lengths.append(len(batches))
        assert len(loader) == len(batches)
        for b in batches:
            assert len(b.__key__) == 7 and len(b.__padding__) == 7
            assert all(b.__padding__) or not any(b.__padding__)
            real += [k for k, pad in zip(b.__key__, b.__padding__) if not pad]
    assert lengths == [2, 2, 2]
    assert len(real) == len(set(real)) == 4 * 7


def test_an_undeclared_generator_is_an_error_not_a_loss(text_val_ds):
    """A plain function returning a generator cannot be planned; with even ranks this is a clear
    error (on one rank nothing is planned, and every output is delivered)."""

    class Hidden(DefaultTaskEncoder):
        def encode_sample(self, sample):
            return Twice().encode_sample(sample)

    wc = WorkerConfig(rank=0, world_size=2, num_workers=0)
    ds = get_val_dataset(text_val_ds, worker_config=wc, batch_size=4, task_encoder=Hidden())
    with pytest.raises(FatalSampleError, match="generator function"):
        list(get_loader(ds))
    one = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_val_dataset(text_val_ds, worker_config=one, batch_size=4, task_encoder=Hidden())
    assert sum(len(b["__key__"]) for b in get_loader(ds)) == 2 * NUM_VAL


def test_a_filler_of_a_type_without_flags_is_a_clear_error(text_val_ds):
    class Tensors(DefaultTaskEncoder):
        def encode_sample(self, sample):
            return torch.tensor([len(sample.text)])

        def batch(self, samples):
            return torch.stack(samples)

    wc = WorkerConfig(rank=2, world_size=3, num_workers=0)  # streams 2 and 5: 6 samples of 7
    ds = get_val_dataset(
        text_val_ds, worker_config=wc, batch_size=1, task_encoder=Tensors(), num_streams=6
    )
    with pytest.raises(PaddingError, match="__padding__"):
        list(get_loader(ds))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_restoring_a_planned_pass_between_fillers(text_val_ds, num_workers):
    wc = WorkerConfig(rank=2, world_size=3, num_workers=num_workers)

    def loader():
        ds = get_val_dataset(text_val_ds, worker_config=wc, batch_size=1, task_encoder=SkipThirds())
        return get_savable_loader(ds)

    full = [(b["__key__"], is_padding(b)) for b in loader()]
    assert any(pad[0] for _, pad in full)
    for split in [*range(0, len(full), 3), len(full) - 1]:
        first = loader()
        it = iter(first)
        head = [next(it) for _ in range(split)]
        state = first.save_state_rank()
        second = loader()
        second.restore_state_rank(state)
        rest = [(b["__key__"], is_padding(b)) for b in second]
        assert [(b["__key__"], is_padding(b)) for b in head] + rest == full


def test_counts_are_the_same_in_every_pass(text_val_ds):
    wc = WorkerConfig(rank=0, world_size=2, num_workers=2)
    loader = get_loader(
        get_val_dataset(text_val_ds, worker_config=wc, batch_size=3, task_encoder=Twice())
    )
    first = [tuple(b["__key__"]) for b in loader]
    second = [tuple(b["__key__"]) for b in loader]
    assert first == second and len(first) > 0


def test_without_torch_distributed_a_data_dependent_pass_warns_once(text_val_ds, monkeypatch):
    """docs/ordering.md: nobody to agree with, so counts may differ; every output still once."""
    monkeypatch.setattr(evenness, "_warned", set())
    wc = WorkerConfig(rank=0, world_size=2, num_workers=0)
    ds = get_val_dataset(text_val_ds, worker_config=wc, batch_size=3, task_encoder=Twice())
    with pytest.warns(UserWarning, match="torch.distributed is not initialised"):
        first = list(get_loader(ds))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second = list(get_loader(ds))  # once per process
    assert not [w for w in caught if "torch.distributed" in str(w.message)]
    assert first and [b["__key__"] for b in first] == [b["__key__"] for b in second]


def test_real_dicts_are_left_as_the_encoder_made_them(text_val_ds):
    """Code written for Megatron-Energon sees the same dict keys; is_padding answers all False."""

    class Dicts(DefaultTaskEncoder):
        def encode_batch(self, batch):
            return {"__key__": list(batch.__key__), "text": list(batch.text)}

    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_val_dataset(text_val_ds, worker_config=wc, batch_size=3, task_encoder=Dicts())
    batches = list(get_loader(ds))
    assert batches and all(set(b) == {"__key__", "text"} for b in batches)
    assert all(is_padding(b) == [False] * len(b["__key__"]) for b in batches)
