"""The Megatron CLI verbs: preprocess, merge, build-sequences, prepare-cache."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from energon.cli.main import cli
from energon.megatron import gpt_indices as gi
from energon.megatron.gpt_dataset import GPTConfig, build_gpt_datasets
from energon.megatron.indexed import IndexedTokens

TEXTS = ["hello world", "", "énergon ✓", "a" * 300, "last line"]


def write_jsonl(path, texts, key="text"):
    path.write_text("".join(json.dumps({key: t, "other": t.upper()}) + "\n" for t in texts))


def run(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_preprocess_bytes_parallel_equals_serial(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", TEXTS * 40)
    run(
        "preprocess",
        tmp_path / "a.jsonl",
        "-o",
        tmp_path / "s",
        "-t",
        "bytes",
        "--append-eod",
        "--no-progress",
        "--json-keys",
        "text,other",
    )
    run(
        "preprocess",
        tmp_path / "a.jsonl",
        "-o",
        tmp_path / "p",
        "-t",
        "bytes",
        "--append-eod",
        "--no-progress",
        "-j",
        "2",
        "--json-keys",
        "text,other",
    )
    for key in ("text", "other"):
        s, p = tmp_path / f"s_{key}_document", tmp_path / f"p_{key}_document"
        assert (s.with_suffix(".bin")).read_bytes() == (p.with_suffix(".bin")).read_bytes()
        assert (s.with_suffix(".idx")).read_bytes() == (p.with_suffix(".idx")).read_bytes()
    ds = IndexedTokens(tmp_path / "s_text_document")
    # the empty text is an empty document (as Megatron-LM's preprocess_data.py writes it): no
    # sequence, no EOD, but it keeps its document number, so document-based splits agree
    assert ds.dtype == np.uint16 and len(ds) == 4 * 40
    docs = ds.document_indices
    assert len(docs) == 5 * 40 + 1
    assert docs[1] == docs[2] == 1  # document 1 (the empty text) holds no sequence
    assert bytes(ds[1][:-1].astype(np.uint8)).decode() == "énergon ✓" and ds[1][-1] == 256


def test_preprocess_with_a_user_callable(tmp_path, monkeypatch):
    (tmp_path / "mytok.py").write_text("def tok(s):\n    return [len(w) for w in s.split()]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    write_jsonl(tmp_path / "a.jsonl", ["aa bbb c", "dddd"])
    run(
        "preprocess",
        tmp_path / "a.jsonl",
        "-o",
        tmp_path / "u",
        "-t",
        "mytok:tok",
        "--append-eod",
        "--eod-id",
        "0",
        "--no-progress",
    )
    ds = IndexedTokens(tmp_path / "u_text_document")
    assert ds.dtype == np.int32  # unknown vocabulary size: the wide dtype
    assert [ds[i].tolist() for i in range(2)] == [[2, 3, 1, 0], [4, 0]]


def test_preprocess_rejects_unknown_tokenizer(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", ["x"])
    result = CliRunner().invoke(
        cli, ["preprocess", str(tmp_path / "a.jsonl"), "-o", str(tmp_path / "o"), "-t", "nonsense"]
    )
    assert result.exit_code != 0 and "unknown tokenizer" in result.output


def test_merge_directory_in_sorted_order(tmp_path):
    for name, texts in [("b", ["bb"]), ("a", ["a", "aa"])]:
        write_jsonl(tmp_path / f"{name}.jsonl", texts)
        (tmp_path / "parts").mkdir(exist_ok=True)
        run(
            "preprocess",
            tmp_path / f"{name}.jsonl",
            "-o",
            tmp_path / "parts" / name,
            "-t",
            "bytes",
            "--no-progress",
        )
    run("merge", tmp_path / "parts", "-o", tmp_path / "merged")
    ds = IndexedTokens(tmp_path / "merged")
    assert [bytes(ds[i].astype(np.uint8)).decode() for i in range(3)] == ["a", "aa", "bb"]


def test_build_sequences_and_prepare_cache_then_nothing_is_built(tmp_path, monkeypatch):
    texts = [f"document number {i} " * (i % 7 + 1) for i in range(200)]
    prefixes = []
    for name in ("x", "y"):
        write_jsonl(tmp_path / f"{name}.jsonl", texts)
        run(
            "preprocess",
            tmp_path / f"{name}.jsonl",
            "-o",
            tmp_path / name,
            "-t",
            "bytes",
            "--append-eod",
            "--no-progress",
        )
        prefixes.append(str(tmp_path / f"{name}_text_document"))
    blend = f"0.3 {prefixes[0]} 0.7 {prefixes[1]}"
    run("build-sequences", *blend.split(), "-o", tmp_path / "seq.json")
    seq = json.loads((tmp_path / "seq.json").read_text())
    assert seq == {p: [200, 201] for p in prefixes}
    out = run(
        "prepare-cache",
        "--data-path",
        blend,
        "--split",
        "98,2,0",
        "--data-cache-path",
        tmp_path / "cache",
        "--seq-length",
        32,
        "--micro-batch-size",
        2,
        "--world-size",
        4096,
        "--train-iters",
        3,
        "--eval-iters",
        1,
        "--eval-interval",
        2,
        "--tokenizer-identifiers",
        '{"class": "ByteTokenizer"}',
    )
    assert "[24576, 16384, 8192]" in out and "0 already cached" in out
    out = run(
        "prepare-cache",
        "--data-path",
        blend,
        "--split",
        "98,2,0",
        "--data-cache-path",
        tmp_path / "cache",
        "--seq-length",
        32,
        "--global-batch-size",
        8192,
        "--train-iters",
        3,
        "--eval-iters",
        1,
        "--eval-interval",
        2,
        "--tokenizer-identifiers",
        '{"class": "ByteTokenizer"}',
    )
    assert " 0 built" in out

    def forbidden(*a, **k):
        raise AssertionError("built although prepared")

    monkeypatch.setattr(gi, "build_gpt_indices", forbidden)
    monkeypatch.setattr(gi, "build_blending_indices", forbidden)
    config = GPTConfig(
        sequence_length=32,
        split="98,2,0",
        tokenizer={"class": "ByteTokenizer"},
        path_to_cache=str(tmp_path / "cache"),
        sequences_path=str(tmp_path / "seq.json"),
    )
    train = build_gpt_datasets(blend, [24576, 16384, 8192], config)[0]
    assert len(train) == 7373 + 17204  # ceil(24576 * w) per prefix, as megatron-core sizes a blend
    assert train[len(train) - 1]["tokens"].shape == (32,)


def test_cli_lists_the_megatron_verbs():
    out = run("--help")
    for verb in ("preprocess", "merge", "build-sequences", "prepare-cache"):
        assert verb in out
