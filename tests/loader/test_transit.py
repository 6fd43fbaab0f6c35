"""Batches from workers arrive with the same values and types: strings of every width (their
non-ASCII Latin-1 lists travel as bytes, see ``energon.loader.transit``), the sources, and the
stream snapshots (packed on the way, unpacked when a state is saved)."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

from energon import TextSample, WorkerConfig, get_loader, get_train_dataset
from energon.loader.transit import pack_strings
from energon.prepare.dataset import prepare_dataset
from tests.helpers.datasets import TEXT_YAML
from tests.helpers.tarfiles import write_tar

# ASCII, Latin-1 (one byte per character in CPython), two- and four-byte characters, a NUL,
# the empty string, and a lone surrogate (only an in-memory str can hold one)
TEXTS = ["plain", "smörgåsbord", "ÿ\x80", "naïve 日本", "emoji 🙂 ö", "a\x00ö", "", "\ud800ö"]


def through_worker_pickle(value):
    return pickle.loads(ForkingPickler.dumps(value, pickle.HIGHEST_PROTOCOL))


def test_packed_strings_arrive_as_the_same_plain_list():
    for texts in (TEXTS, TEXTS[1:3], ["ö"] * 3):
        batch = TextSample(__key__=["k"] * len(texts), __restore_key__=(), text=list(texts))
        pack_strings(batch)
        again = through_worker_pickle(batch)
        assert type(again.text) is list and again.text == texts
        assert all(type(t) is str for t in again.text)
        assert type(again.__key__) is list and again.__key__ == ["k"] * len(texts)


def test_packed_dict_values_and_other_values():
    value = {"text": list(TEXTS), "n": [1, 2], "mixed": ["ö", 1], "ascii": ["a"]}
    pack_strings(value)
    again = through_worker_pickle(value)
    assert again == {"text": TEXTS, "n": [1, 2], "mixed": ["ö", 1], "ascii": ["a"]}
    assert all(type(v) is list for v in again.values())
    pack_strings(None)  # nothing to pack
    pack_strings((["ö"],))


def make_wide_text_dataset(root):
    """48 samples in 2 shards whose texts cover every string width."""
    for shard in range(2):
        members = []
        for i in range(24):
            text = f"{TEXTS[i % 7]} {shard}/{i}"  # no lone surrogate: not valid UTF-8
            members.append((f"{shard:02d}_{i:04d}.txt", text.encode("utf-8")))
        write_tar(root / f"part{shard}.tar", members)
    prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False, num_workers=1)
    (root / ".nv-meta" / "dataset.yaml").write_text(TEXT_YAML)
    return root


def run(root, num_workers, batches=10, restore=None):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    ds = get_train_dataset(
        root,
        worker_config=wc,
        batch_size=5,
        shuffle_buffer_size=7,
        max_samples_per_sequence=4,
        num_streams=4,
    )
    loader = get_loader(ds)
    if restore is not None:
        loader.restore_state_rank(restore)
    it = iter(loader)
    out = [next(it) for _ in range(batches)]
    return out, loader.save_state_rank()


def test_workers_deliver_what_the_main_process_makes(tmp_path):
    root = make_wide_text_dataset(tmp_path)
    plain, plain_state = run(root, 0)
    workers, workers_state = run(root, 2)
    assert [b.text for b in workers] == [b.text for b in plain]
    assert any(not t.isascii() for b in workers for t in b.text)
    for b in workers:
        assert type(b.text) is list and all(type(t) is str for t in b.text)
    assert [b.__sources__ for b in workers] == [b.__sources__ for b in plain]
    assert [b.__restore_key__ for b in workers] == [b.__restore_key__ for b in plain]
    # the states hold the unpacked snapshots: equal, and both continue alike
    assert workers_state == plain_state
    after_plain, _ = run(root, 0, batches=4, restore=plain_state)
    after_workers, _ = run(root, 2, batches=4, restore=workers_state)
    assert [b.text for b in after_workers] == [b.text for b in after_plain]
