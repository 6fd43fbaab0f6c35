"""``energon demo-av``: generate small video clips with audio, prepare them with media metadata,
and load uniformly sampled frames and audio clips as ``VidQASample`` batches."""

from __future__ import annotations

import json
import os
import shutil
import time

import click

from energon.cli.arguments import OutputPath
from energon.format.layout import DATASET_YAML_FILENAME, nv_meta_dir

DEMO_AV_DATASET_YAML = """sample_type:
  __module__: megatron.energon
  __class__: VidQASample
field_map:
  video: mp4
  context: txt
  answers: json[answers]
"""


def _write_dataset(root: str, clips: int, shards: int, seconds: float) -> None:
    from tqdm import tqdm

    from energon.demo.av import encode_video, pick_codec, write_tar_shards

    codec = pick_codec("libx264", "h264", "mpeg4")
    samples = []
    for i in tqdm(range(clips), desc="Encoding clips", unit="clip"):
        video = encode_video(
            video_codec=codec,
            width=96,
            height=64,
            seconds=seconds,
            audio_codec="aac",
            gop=15,
            texture_seed=i,
        )
        question = f"What number is shown at the end of clip {i}?".encode()
        answers = json.dumps({"answers": [str(round(seconds * 30) - 1)]}).encode()
        samples.append((f"clip{i:05d}", {"mp4": video, "txt": question, "json": answers}))
    write_tar_shards(root, samples, shards)


def _uniform_frames_encoder():
    """A task encoder that turns each lazy video into 8 uniformly spaced, resized frames."""
    from energon import DefaultTaskEncoder
    from energon.av import get_single_frames_uniform
    from energon.samples import VidQASample

    class UniformFrames(DefaultTaskEncoder):
        def encode_sample(self, sample: VidQASample) -> VidQASample:
            frames = get_single_frames_uniform(sample.video, 8, video_out_frame_size=(64, 48))
            return VidQASample.derive_from(
                sample, video=frames, context=sample.context, answers=sample.answers
            )

    return UniformFrames()


def _show_lazy_decoding(root: str) -> None:
    """What a sample's lazy video offers before any frame is decoded, and two clips of it."""
    from energon import WorkerConfig, get_loader, get_val_dataset

    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = get_val_dataset(root, split_part="train", worker_config=wc, batch_size=None)
    sample = next(iter(get_loader(dataset)))
    video = sample.video
    click.echo(f"3. One sample: {sample.__key__}, video = {video!r} (nothing decoded yet)")
    data = video.get_clips(video_clip_ranges=[(1.0, 1.5)], audio_clip_ranges=[(1.0, 1.5)])
    click.echo(
        f"   clip 1.0-1.5 s: video {tuple(data.video_clips[0].shape)} at "
        f"{data.video_timestamps[0]}, audio {tuple(data.audio_clips[0].shape)} at "
        f"{data.audio_timestamps[0]}"
    )


@click.command(name="demo-av")
@click.option(
    "--workdir",
    type=OutputPath("dir"),
    default="demo_av_data",
    show_default=True,
    help="Where the data goes.",
)
@click.option(
    "--clips", type=click.IntRange(min=1), default=32, show_default=True, help="Number of clips."
)
@click.option(
    "--shards", type=click.IntRange(min=1), default=4, show_default=True, help="Number of shards."
)
@click.option(
    "--seconds",
    type=click.FloatRange(min=1.5),
    default=4.0,
    show_default=True,
    help="Length of each clip (at least 1.5 s: the demo cuts a clip at 1.0-1.5 s).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="Loader worker processes.",
)
@click.option("--fresh", is_flag=True, help="Regenerate the dataset even if it exists.")
def command(
    workdir: str, clips: int, shards: int, seconds: float, workers: int, fresh: bool
) -> None:
    """Generate, prepare (with media metadata) and load a small video-QA dataset."""
    from energon import WorkerConfig, get_loader, get_val_dataset
    from energon.media import MediaFilterConfig, get_media_metadata
    from energon.prepare.dataset import prepare_dataset

    if shards > clips:
        raise click.BadParameter(
            f"{shards} shards for {clips} clips: every shard needs a clip", param_hint="'--shards'"
        )
    root = os.path.abspath(workdir)
    if fresh and os.path.isdir(root):
        shutil.rmtree(root)
    if not (nv_meta_dir(root) / DATASET_YAML_FILENAME).exists():
        click.echo(
            f"1. Encoding {clips} clips of {seconds:g} s (96x64, 30 fps, AAC audio) into {root}"
        )
        _write_dataset(root, clips, shards, seconds)
        click.echo("2. Preparing with --media-metadata-by-extension")
        prepare_dataset(
            root,
            split_parts_ratio=[("train", 1.0)],
            media_filter=MediaFilterConfig.parse(extension=True),
            progress=False,
        )
        with open(nv_meta_dir(root) / DATASET_YAML_FILENAME, "w") as f:
            f.write(DEMO_AV_DATASET_YAML)
    else:
        click.echo(f"1-2. Reusing the prepared dataset in {root} (--fresh to regenerate)")
    click.echo(f"   media metadata of clip00000.mp4: {get_media_metadata(root, 'clip00000.mp4')}")

    _show_lazy_decoding(root)
    click.echo(f"4. Loading 8 uniform frames per clip as VidQASample batches, {workers} workers")
    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    dataset = get_val_dataset(
        root,
        split_part="train",
        worker_config=wc,
        batch_size=4,
        task_encoder=_uniform_frames_encoder(),
    )
    start = time.perf_counter()
    count = 0
    for step, batch in enumerate(get_loader(dataset)):
        if step == 0:
            click.echo(f"   first batch after {time.perf_counter() - start:.2f} s:")
            click.echo(f"   keys {batch.__key__}")
            click.echo(f"   video (batch, frames, C, H, W) {tuple(batch.video.shape)}")
            click.echo(f"   question {batch.context[0]!r}, answers {batch.answers[0]}")
        count += len(batch.__key__)
    elapsed = time.perf_counter() - start
    click.echo(f"   {count} clips in {elapsed:.2f} s = {count / elapsed:,.1f} clips/s")
