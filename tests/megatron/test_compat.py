"""Equality with the real megatron-core: .bin/.idx bytes, GPT and blend indices, cache names, samples.

Every check runs against megatron-core 0.16.1 and the current 0.19.x, each in its side venv (see
tests/helpers/megatron_venv.py); skipped with a printed reason only when a venv cannot be created.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from energon.megatron.gpt_dataset import GPTConfig, build_gpt_datasets
from energon.megatron.indexed import IndexedTokens, TokenFileWriter
from tests.helpers.megatron_venv import mcore_any, run_mcore  # noqa: F401  (fixture)

pytestmark = pytest.mark.compat

VOCAB = 1000
EOD = 0


def random_docs(seed: int, num_docs: int, max_seqs: int = 2) -> list[list[list[int]]]:
    """Documents of 0..max_seqs sequences of 1..60 tokens, each ending with EOD (local generator)."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(num_docs):
        seqs = []
        for _ in range(int(rng.integers(0, max_seqs + 1)) if max_seqs > 1 else 1):
            n = int(rng.integers(1, 60))
            seqs.append([*rng.integers(1, VOCAB, n - 1).tolist(), EOD])
        docs.append(seqs)
    return docs


def write_ours(prefix, docs, dtype="uint16", multimodal=False, add_index=()):
    w = TokenFileWriter(prefix, dtype=dtype, multimodal=multimodal)
    for doc in docs:
        for seq in doc:
            w.add_item(np.asarray(seq), mode=len(seq) % 2)
        w.end_document()
    for p in add_index:
        w.add_index(p)
    w.finalize()


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpora")
    prefixes = []
    for i, n in enumerate([300, 120, 40]):
        p = str(root / f"c{i}")
        write_ours(p, random_docs(i, n, max_seqs=1))
        prefixes.append(p)
    return prefixes


def read_bytes(prefix):
    return open(prefix + ".bin", "rb").read(), open(prefix + ".idx", "rb").read()


WRITER_CASES = [("uint16", False), ("int32", False), ("int64", False), ("uint16", True)]


@pytest.fixture(scope="module")
def written_by_both(mcore_any, tmp_path_factory):  # noqa: F811
    """Every writer case written by us and by megatron-core (one megatron-core run for all)."""
    root = tmp_path_factory.mktemp("writer")
    jobs = []
    for dtype, multimodal in WRITER_CASES:
        case = root / f"{dtype}-{multimodal}"
        case.mkdir()
        docs = random_docs(3, 25)
        docs.insert(2, [])  # an empty document is legal
        base = str(case / "base")
        write_ours(base, random_docs(4, 5), dtype=dtype, multimodal=multimodal)
        ours, theirs = str(case / "ours"), str(case / "theirs")
        write_ours(ours, docs, dtype=dtype, multimodal=multimodal, add_index=[base])
        jobs.append(
            {
                "out": str(case),
                "write": {
                    "prefix": theirs,
                    "dtype": dtype,
                    "docs": docs,
                    "multimodal": multimodal,
                    "add_index": [base],
                },
                "read": ours,
                "read_multimodal": multimodal,
            }
        )
    run_mcore(mcore_any, {"out": str(root), "io": jobs})
    return root


@pytest.mark.parametrize("dtype,multimodal", WRITER_CASES)
def test_writer_is_byte_identical_and_cross_readable(written_by_both, dtype, multimodal):
    case = written_by_both / f"{dtype}-{multimodal}"
    ours, theirs = str(case / "ours"), str(case / "theirs")
    assert read_bytes(ours) == read_bytes(theirs)
    mine = IndexedTokens(theirs)
    all_tokens = np.concatenate([mine[i] for i in range(len(mine))])
    assert np.array_equal(np.load(case / "read_tokens.npy"), all_tokens)
    assert np.array_equal(np.load(case / "read_docs.npy"), mine.document_indices)
    assert (mine.modes is not None) == multimodal


GPT_CASES = {
    # separate final epoch in train, a single epoch in valid/test
    "single": dict(blend=["c0"], split="90,8,2", seq=16, seed=1234, sizes=[700, 30, 10]),
    "no_extra_token": dict(
        blend=["c0"],
        split="80,20",
        seq=33,
        seed=7,
        sizes=[90, 1000, None],
        extra=False,
        drop_last_valid=False,
    ),
    "weighted_tiny": dict(
        blend=["0.7", "c0", "0.3", "c1", "0.001", "c2"],
        split="98,2,0",
        seq=8,
        seed=3,
        sizes=[500, 20, 0],
    ),
    "unweighted": dict(
        blend=["c0", "c1"], split="50,50,0", seq=12, seed=11, sizes=[100, None, None]
    ),
    "per_split": dict(
        per_split=[["2", "c0", "1", "c1"], ["c2"], None], seq=10, seed=5, sizes=[300, 20, None]
    ),
    # megatron-core 0.19's document boundaries (cu_seqlens, max_seqlen, per-document positions);
    # long windows span several documents, the last validation window is padded
    "inter_document": dict(
        blend=["c1"],
        split="80,20",
        seq=96,
        seed=9,
        sizes=[60, None, None],
        inter_document_masking=True,
        drop_last_valid=False,
        compare=1000,  # every sample
        since="0.19",
    ),
    "inter_document_no_extra": dict(
        blend=["0.5", "c0", "0.5", "c1"],
        split="100,0,0",
        seq=40,
        seed=2,
        sizes=[50, 0, 0],
        inter_document_masking=True,
        extra=False,
        compare=1000,
        since="0.19",
    ),
}


def _cases_for(version: str) -> dict[str, dict]:
    """The cases a megatron-core release supports (``since``: the first release with the feature)."""
    key = tuple(int(x) for x in version.split(".")[:2])
    return {
        name: case
        for name, case in GPT_CASES.items()
        if tuple(int(x) for x in case.get("since", "0.0").split(".")) <= key
    }


def _resolve(blend, prefixes):
    if blend is None:
        return None
    names = {f"c{i}": p for i, p in enumerate(prefixes)}
    return [names.get(t, t) for t in blend]


def _our_datasets(case, prefixes, cache):
    config = GPTConfig(
        sequence_length=case["seq"],
        random_seed=case["seed"],
        split=case.get("split") or "969, 30, 1",
        tokenizer={"class": "Tok", "vocab": VOCAB},
        eod_token=EOD,
        add_extra_token_to_sequence=case.get("extra", True),
        drop_last_partial_validation_sequence=case.get("drop_last_valid", True),
        inter_document_masking=case.get("inter_document_masking", False),
        path_to_cache=cache,
    )
    per_split = case.get("per_split")
    return build_gpt_datasets(
        _resolve(case.get("blend"), prefixes),
        case["sizes"],
        config,
        blend_per_split=[_resolve(b, prefixes) for b in per_split] if per_split else None,
    )


@pytest.fixture(scope="module")
def mcore_results(corpora, mcore_any, tmp_path_factory):  # noqa: F811
    """One megatron-core run builds every case (one interpreter start for all of them)."""
    root = tmp_path_factory.mktemp("mcore")
    root.joinpath("version").write_text(mcore_any.version)
    gpts = []
    for name, case in _cases_for(mcore_any.version).items():
        per_split = case.get("per_split")
        gpts.append(
            {
                **case,
                "blend": _resolve(case.get("blend"), corpora),
                "per_split": [_resolve(b, corpora) for b in per_split] if per_split else None,
                "split": case.get("split"),
                "cache": str(root / name / "cache"),
                "out": str(root / name / "arrays"),
                "vocab": VOCAB,
                "eod": EOD,
                "samples": case.get("compare", 3),
            }
        )
    run_mcore(mcore_any, {"out": str(root), "gpts": gpts})
    return root


@pytest.mark.parametrize("name", list(GPT_CASES))
def test_indices_samples_and_cache_names_equal_megatron_core(
    name, corpora, mcore_results, tmp_path
):
    import json

    case = GPT_CASES[name]
    version = (mcore_results / "version").read_text()
    if name not in _cases_for(version):
        pytest.skip(f"megatron-core {version} predates {case['since']}")
    theirs = mcore_results / name
    summary = json.loads((theirs / "arrays" / "summary.json").read_text())
    ours = _our_datasets(case, corpora, str(tmp_path / "cache"))
    for i, ds in enumerate(ours):
        if summary[i] is None:
            assert ds is None
            continue
        assert type(ds).__name__ == {"GPTDataset": "GPTTokenDataset"}.get(
            summary[i]["class"], "BlendedTokenDataset"
        )
        assert ds.unique_description_hash == summary[i]["hash"]
        assert len(ds) == summary[i]["len"]
        for array_name, array in ds.indices().items():
            expected = np.load(theirs / "arrays" / f"{i}_{array_name}.npy")
            assert array.dtype == expected.dtype, (i, array_name)
            assert np.array_equal(array, expected), (i, array_name)
        for k in range(min(case.get("compare", 3), len(ds))):
            sample = ds[k]
            keys = json.loads((theirs / "arrays" / f"{i}_s{k}_keys.json").read_text())
            assert sorted(sample) == keys, (i, k)
            for key in keys:
                expected = np.load(theirs / "arrays" / f"{i}_s{k}_{key}.npy")
                assert np.array_equal(np.asarray(sample[key]), expected), (i, k, key)
                assert np.asarray(sample[key]).dtype == expected.dtype, (i, k, key)
    # same cache file names (and bytes of the arrays): the caches are interchangeable
    mine = sorted(os.listdir(tmp_path / "cache"))
    assert mine == sorted(os.listdir(theirs / "cache"))
    for f in mine:
        if f.endswith(".npy"):
            assert np.array_equal(np.load(tmp_path / "cache" / f), np.load(theirs / "cache" / f))
        else:
            assert (tmp_path / "cache" / f).read_text() == (theirs / "cache" / f).read_text()


def test_cache_built_by_megatron_core_is_a_hit(corpora, mcore_results, monkeypatch):
    """Loading megatron-core's cache builds nothing: our builders are never called."""
    from energon.megatron import gpt_indices

    def forbidden(*a, **k):
        raise AssertionError("index built although the cache was present")

    monkeypatch.setattr(gpt_indices, "build_gpt_indices", forbidden)
    monkeypatch.setattr(gpt_indices, "build_blending_indices", forbidden)
    case = GPT_CASES["weighted_tiny"]
    train = _our_datasets(case, corpora, str(mcore_results / "weighted_tiny" / "cache"))[0]
    assert train.cache_present
    assert len(train) == 501  # sum of ceil(500 * w_d): megatron's top-level size rounds up
    assert train[500]["tokens"].shape == (case["seq"],)
