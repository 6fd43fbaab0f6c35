"""A synthetic vision-language mix with real encoded media, for the balanced-batching tests,
benchmark and docs: log-normal text lengths, 0-8 JPEG images of mixed sizes per sample and some
short MP4 videos, prepared with media metadata; and :class:`VlmTaskEncoder`, which turns a sample
into the token sequence whose length :class:`~energon.balance.MultimodalCost` estimates from the
index alone (text bytes / 4 + image patches + sampled video frames).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import torch

from energon.balance.cost import MultimodalCost
from energon.demo.av import encode_video, write_tar_shards
from energon.demo.datasets import _random_texts, render_photo_like_jpeg
from energon.samples import Sample
from energon.structs import edataclass
from energon.task_encoder.base import DefaultTaskEncoder, stateless
from energon.task_encoder.cooking import Cooker, basic_sample_keys

IMAGE_SIZES = ((56, 56), (112, 84), (224, 224), (336, 252), (448, 448), (640, 480))
CRUDE_YAML = "__module__: megatron.energon\n__class__: CrudeWebdataset\n"


def write_vlm_shards(
    root: str | os.PathLike,
    *,
    num_samples: int,
    num_shards: int,
    seed: int = 0,
    max_images: int = 8,
    video_fraction: float = 0.1,
    text_median_chars: int = 800,
    text_sigma: float = 1.0,
    prepare: bool = True,
) -> str:
    """Write (and by default prepare, with media metadata) the synthetic VLM dataset."""
    from energon.format.layout import DATASET_YAML_FILENAME, nv_meta_dir
    from energon.media.extract import MediaFilterConfig, MediaFilterStrategy
    from energon.prepare.dataset import prepare_dataset

    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(math.log(text_median_chars), text_sigma, num_samples), 8, 60000)
    texts = _random_texts(rng, [int(n) for n in lengths])
    clips = {
        seconds: encode_video(width=64, height=48, fps=8, seconds=seconds) for seconds in (1, 2, 4)
    }
    jpegs = [
        render_photo_like_jpeg(rng, w, h, quality=80) for w, h in IMAGE_SIZES for _ in range(3)
    ]
    samples = []
    for i, text in enumerate(texts):
        parts: dict[str, bytes] = {"txt": text.encode()}
        if rng.random() < video_fraction:
            parts["mp4"] = clips[int(rng.choice([1, 2, 4]))]
        else:
            for j in range(int(rng.integers(0, max_images + 1))):
                parts[f"img{j}.jpg"] = jpegs[int(rng.integers(len(jpegs)))]
        samples.append((f"{i:07d}", parts))
    write_tar_shards(root, samples, num_shards=num_shards)
    if prepare:
        prepare_dataset(
            root,
            split_parts_ratio=[("train", 1.0)],
            progress=False,
            num_workers=1,
            media_filter=MediaFilterConfig(MediaFilterStrategy.EXTENSION),
        )
        (nv_meta_dir(root) / DATASET_YAML_FILENAME).write_text(CRUDE_YAML)
    return str(root)


@edataclass
class VlmSample(Sample):
    tokens: torch.Tensor  # text, image and frame token ids (images: -1, frames: -2)
    images: list
    video_frames: int


def vlm_tokens(sample: dict[str, Any], cost: MultimodalCost) -> tuple[int, int, list, int]:
    """(text tokens, vision tokens, images, video frames) of a decoded crude sample, as ``cost`` counts them."""
    text = sample["txt"]
    text_tokens = math.ceil(
        len(text.encode() if isinstance(text, str) else text) / cost.bytes_per_token
    )
    images = [sample[k] for k in sorted(sample) if k.endswith(".jpg")]
    vision = sum(cost.image_tokens(int(im.shape[-1]), int(im.shape[-2])) for im in images)
    frames = 0
    if "mp4" in sample:
        _, frames = sample["mp4"].get_video_duration(get_frame_count=True)
        vision += math.ceil(frames / cost.frame_stride) * cost.tokens_per_frame
    return text_tokens, vision, images, frames


class VlmTaskEncoder(DefaultTaskEncoder):
    """Cooks the synthetic VLM samples into :class:`VlmSample` (token ids are stand-ins)."""

    def __init__(self, cost: MultimodalCost | None = None) -> None:
        super().__init__()
        self.cost = cost or MultimodalCost()

        @stateless
        def cook(sample: dict[str, Any]) -> VlmSample:
            text_tokens, vision, images, frames = vlm_tokens(sample, self.cost)
            tokens = torch.cat(
                [torch.arange(text_tokens) % 50000, torch.full((vision,), -1, dtype=torch.long)]
            )
            return VlmSample(
                **basic_sample_keys(sample),
                tokens=tokens,
                images=images,
                video_frames=frames,
            )

        self.cookers = [Cooker(cook)]
