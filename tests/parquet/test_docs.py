"""docs/parquet.md's walk-through runs as written (a folder used as it is, `energon prepare` and
`energon info`, training with save and restore, a join by key)."""

from __future__ import annotations

from tests.helpers.doc_walkthrough import run_walkthrough


def test_walkthrough_runs_as_written(tmp_path):
    text = run_walkthrough("parquet.md", tmp_path)
    assert "train-00001-of-00003.parquet/0 img0040 a picture, number 40 (3, 32, 48)" in text
    assert "Found 120 rows in 3 files, 9 row groups" in text
    assert "* train: 66.67% (80 rows, 2 files)" in text
    assert "CaptioningSample torch.Size([4, 3, 32, 48])" in text
    joined = "('img0000', 'a picture, number 0 / ein Bild, Nummer 0'), ('img0001', 'a picture, number 1 / (keine)')"
    assert f"80 [{joined}]" in text  # a Parquet-Parquet join by key
