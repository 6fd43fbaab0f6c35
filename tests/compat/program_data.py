"""The datasets the reference-style programs run on (``programs*.py``), written once per test
module with real tar shards, real images and a real video, and prepared with energon's prepare
(whose output the reference reads). ``build(root)`` returns name -> path."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import yaml

from energon.format.jsonl import prepare_jsonl
from energon.prepare.dataset import prepare_dataset
from tests.helpers.tarfiles import png_bytes, write_tar


def _prepare(root: Path, members_per_shard: list[list[tuple[str, bytes]]], split, config) -> str:
    for shard, members in enumerate(members_per_shard):
        write_tar(root / "parts" / f"data-{shard}.tar", members)
    prepare_dataset(root, split_parts_ratio=split, progress=False, num_workers=1)
    text = config if isinstance(config, str) else yaml.safe_dump(config)
    (root / ".nv-meta" / "dataset.yaml").write_text(text)
    return str(root)


def _text_dataset(root: Path, prefix: str, count: int, per_shard: int, split, config) -> str:
    shards = [
        [
            (f"{prefix}{i:03d}.txt", f"{prefix}-text-{i}".encode())
            for i in range(first, min(count, first + per_shard))
        ]
        for first in range(0, count, per_shard)
    ]
    return _prepare(root, shards, split, config)


def _sample_type(name: str, field_map: dict | None = None, **extra) -> dict:
    config = {"sample_type": {"__module__": "megatron.energon", "__class__": name}, **extra}
    if field_map is not None:
        config["field_map"] = field_map
    return config


def _metadataset(path: Path, splits: dict, v1: bool = False) -> str:
    cls = "Metadataset" if v1 else "MetadatasetV2"
    path.write_text(
        yaml.safe_dump({"__module__": "megatron.energon", "__class__": cls, "splits": splits})
    )
    return str(path)


def _video(path: Path, frames: int = 20) -> str:
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 32, 24, "yuv420p"
        for i in range(frames):
            image = np.full((24, 32, 3), (i * 11) % 256, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return str(path)


JOIN_MODULE = """
from megatron.energon import TextSample

def join_texts(main: TextSample, other: TextSample) -> TextSample:
    return TextSample.derive_from(main, text=main.text + "|" + other.text)
"""

SAMPLE_LOADER = """
def sample_loader(raw: dict) -> dict:
    return dict(text=raw["txt"].upper() + "!")

def part_filter(part: str) -> bool:
    return part == "txt"
"""


def build(root: Path) -> dict[str, str]:
    text = lambda src: _sample_type("TextSample", {"text": "txt"}, subflavors={"src": src})  # noqa: E731
    out = {
        "root": str(root),
        "a": _text_dataset(root / "a", "a", 55, 20, [("train", 0.67), ("val", 0.33)], text("a")),
        "b": _text_dataset(root / "b", "b", 30, 10, [("train", 1.0)], text("b")),
        "b2": _text_dataset(root / "b2", "b", 30, 15, [("train", 1.0)], text("b2")),
        "crude": _text_dataset(
            root / "crude",
            "b",
            12,
            6,
            [("train", 1.0)],
            {
                "__module__": "megatron.energon",
                "__class__": "CrudeWebdataset",
                "subflavors": {"c": 1},
            },
        ),
    }
    # alternative configs next to b's own: dataset_config= / split_config=
    meta = root / "b" / ".nv-meta"
    (meta / "dataset_alt.yaml").write_text(
        yaml.safe_dump(_sample_type("TextSample", {"text": "txt"}, subflavors={"alt": True}))
    )
    split = yaml.safe_load((meta / "split.yaml").read_text())
    split["split_parts"] = {"train": [], "val": split["split_parts"]["train"]}
    (meta / "split_alt.yaml").write_text(yaml.safe_dump(split))

    # media samples: captioning, VQA, classification
    out["cap"] = _prepare(
        root / "cap",
        [
            [
                m
                for k in range(s * 6, s * 6 + 6)
                for m in (
                    (f"c{k:03d}.png", png_bytes(k, 12)),
                    (f"c{k:03d}.txt", f"caption {k}".encode()),
                )
            ]
            for s in range(2)
        ],
        [("train", 1.0)],
        _sample_type("CaptioningSample", {"image": "png", "caption": "txt"}),
    )
    out["vqa"] = _prepare(
        root / "vqa",
        [
            [
                m
                for k in range(8)
                for m in (
                    (f"q{k:03d}.png", png_bytes(k, 10)),
                    (f"q{k:03d}.txt", f"what is {k}?".encode()),
                    (f"q{k:03d}.ans.json", json.dumps([str(k), f"number {k}"]).encode()),
                )
            ]
        ],
        [("train", 1.0)],
        _sample_type("VQASample", {"image": "png", "context": "txt", "answers": "ans.json"}),
    )
    out["cls"] = _prepare(
        root / "cls",
        [
            [
                m
                for k in range(10)
                for m in ((f"i{k:03d}.png", png_bytes(k)), (f"i{k:03d}.cls", str(k % 3).encode()))
            ]
        ],
        [("train", 1.0)],
        _sample_type("ImageClassificationSample", {"image": "png", "label": "cls"}),
    )
    # a dataset with its own sample loader (python next to dataset.yaml)
    out["sl"] = _text_dataset(
        root / "sl",
        "s",
        9,
        5,
        [("train", 1.0)],
        {
            "sample_type": {"__module__": "megatron.energon", "__class__": "TextSample"},
            "sample_loader": "sample_loader.py:sample_loader",
            "part_filter": "sample_loader.py:part_filter",
        },
    )
    (root / "sl" / ".nv-meta" / "sample_loader.py").write_text(SAMPLE_LOADER)
    # a crude JSONL dataset
    jsonl = root / "lines.jsonl"
    jsonl.write_text("".join(json.dumps({"text": f"line {i}", "n": i}) + "\n" for i in range(20)))
    prepare_jsonl(jsonl)
    out["jsonl"] = str(jsonl)
    # video, in a folder and in a crude dataset
    videos = root / "videos"
    videos.mkdir()
    out["video"] = _video(videos / "clip.mp4")
    out["av"] = _prepare(
        root / "av",
        [[("v000.mp4", Path(out["video"]).read_bytes()), ("v000.txt", b"a clip")]],
        [("train", 1.0)],
        {"__module__": "megatron.energon", "__class__": "CrudeWebdataset", "subflavors": {"av": 1}},
    )
    images = root / "images"
    images.mkdir()
    for k in range(4):
        buf = io.BytesIO()
        from PIL import Image

        Image.new("RGB", (8 + k, 6 + 2 * k), (k * 40, 0, 0)).save(buf, "PNG")
        (images / f"img{k}.png").write_bytes(buf.getvalue())
    out["images"] = str(images)

    # metadatasets
    out["mds"] = _metadataset(
        root / "mds.yaml",
        {"train": {"blend": [{"path": "a", "weight": 1}, {"path": "b", "weight": 4}]}},
    )
    out["crude_mds"] = _metadataset(
        root / "crude_mds.yaml", {"train": {"path": "crude", "aux": {"other": "b"}}}
    )
    out["mds_val"] = _metadataset(
        root / "mds_val.yaml",
        {
            "val": {
                "blend": [
                    {"path": "a", "weight": 1, "subflavors": {"part": 1}},
                    {"path": "b", "weight": 1, "split_part": "train", "subflavors": {"part": 2}},
                ],
            }
        },
    )
    out["mds_v1"] = _metadataset(
        root / "mds_v1.yaml",
        {
            "train": {
                "datasets": [
                    {"weight": 1, "path": "a"},
                    {"weight": 1, "path": "b", "subflavors": {"v1": 1}},
                ]
            },
            "val": {"datasets": [{"weight": 1, "path": "a"}]},
        },
        v1=True,
    )
    out["mds_epoch"] = _metadataset(
        root / "mds_epoch.yaml",
        {
            "train": {
                "blend_epochized": [
                    {"path": "a", "repetitions": 2},
                    {"path": "b", "repetitions": 1},
                ]
            }
        },
    )
    out["mds_subset"] = _metadataset(
        root / "mds_subset.yaml",
        {
            "train": {"path": "b", "subset": {"range": [0, 10]}},
            "val": {"path": "b", "split_part": "train", "subset": {"range": ["50%", "100%"]}},
        },
    )
    out["mds_nested"] = _metadataset(
        root / "mds_nested.yaml",
        {
            "train": {
                "blend": [
                    {"path": "mds.yaml", "weight": 1, "subflavors": {"nested": True}},
                    {"path": "b2", "weight": 1},
                ]
            }
        },
    )
    (root / "joinmod.py").write_text(JOIN_MODULE)
    out["mds_join"] = _metadataset(
        root / "mds_join.yaml",
        {
            "train": {
                "join": {"main": {"path": "b"}, "other": {"path": "b2"}},
                "joiner": {"__module__": "joinmod", "__function__": "join_texts"},
            }
        },
    )
    out["mds_aux"] = _metadataset(
        root / "mds_aux.yaml",
        {"train": {"path": "crude", "aux": {"store": "filesystem://files_aux", "other": "b"}}},
    )
    (root / "files_aux").mkdir()
    for k in range(12):
        (root / "files_aux" / f"b{k:03d}.extra").write_text(f"extra {k}")
    files = root / "files"
    files.mkdir()
    (files / "hello.txt").write_text("hello")
    out["files"] = str(files)
    return out
