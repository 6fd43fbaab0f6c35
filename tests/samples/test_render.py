"""Compact and detailed sample renderings, batch key extraction."""

from __future__ import annotations

import numpy as np
import torch
import yaml

from energon.samples import CaptioningSample, CrudeSample
from energon.samples.render import (
    default_get_batch_keys,
    format_sample_compact,
    format_sample_detailed,
)


def _sample() -> CaptioningSample:
    return CaptioningSample(
        __key__="k1",
        __restore_key__=("ds", 1),
        image=torch.arange(12, dtype=torch.float32).reshape(3, 2, 2),
        caption="x" * 80,
    )


def test_compact_is_one_line_with_tensor_summary_and_truncation():
    text = format_sample_compact(_sample())
    assert "\n" not in text
    assert text.startswith("CaptioningSample(__key__='k1', __restore_key__=('ds', 1)")
    assert "image=Tensor(shape=(3, 2, 2), dtype=torch.float32, device=cpu)" in text
    assert "caption='" + "x" * 47 + "...'" in text


def test_compact_limits_items_and_depth():
    text = format_sample_compact({"l": list(range(20)), "deep": [[[[1]]]]}, depth=3, max_items=3)
    assert text == "{'l': [0, 1, 2, ...(+17)], 'deep': [[...]]}"
    assert format_sample_compact(b"abcd") == "bytes(len=4)"
    assert format_sample_compact(np.zeros((2, 3))) == "ndarray(shape=(2, 3), dtype=float64)"


def test_detailed_is_yaml_with_class_name_and_tensor_stats():
    text = format_sample_detailed(_sample(), indent="  ")
    assert all(line.startswith("  ") for line in text.splitlines())
    data = yaml.safe_load(text)
    fields = data["CaptioningSample"]
    assert fields["__key__"] == "k1" and fields["__restore_key__"] == ["ds", 1]
    image = fields["image"]["Tensor"]
    assert image["shape"] == [3, 2, 2] and image["dtype"] == "torch.float32"
    assert (image["min"], image["max"]) == (0.0, 11.0)
    assert image["values"] == [0.0, 1.0, 2.0, "...", 9.0, 10.0, 11.0]


def test_detailed_limits_dicts_sequences_and_strings():
    data = yaml.safe_load(
        format_sample_detailed(
            {"d": {str(i): i for i in range(30)}, "s": list(range(12)), "t": "y" * 1200}
        )
    )
    assert len(data["d"]) == 26 and data["d"]["..."] == "5 more"
    assert data["s"][:10] == list(range(10)) and data["s"][10] == "... 2 more"
    assert len(data["t"]) == 1000 and data["t"].endswith("...")


def test_batch_keys_from_batches_dicts_and_sample_lists():
    assert default_get_batch_keys(_sample()) == ["k1"]
    assert default_get_batch_keys(CrudeSample(__key__=["a", "b"])) == ["a", "b"]
    assert default_get_batch_keys([_sample(), {"__key__": "k2"}]) == ["k1", "k2"]
    assert default_get_batch_keys(object()) is None
