"""``energon report CONFIG -o report.html``: one self-contained page to look at before training.

The page holds (everything inlined: images as data URIs, no file or network fetch):

- a grid of random samples, each part shown by its kind: images as they are stored, audio with a
  player, video as a thumbnail of its first frame (PyAV), text and JSON as their first lines;
- histograms of sample sizes per part (bytes, from the index: nothing is read for them);
- histograms of image widths and heights per part: from prepare's media metadata
  (``--media-metadata-*``, no data read) when the dataset has it, else from the images of the
  sample grid (their headers);
- the simulation (:mod:`energon.preflight.simulate`): its figures, the shares of each source among
  the samples delivered over the first steps, samples drawn per shard in an epoch, and its warnings.

Plots use matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable
from typing import Any

from energon.errors import MissingDependencyError
from energon.plan.rng import CounterRng, stable_seed
from energon.preflight.simulate import Simulation, SimulationSettings, build, simulate
from energon.source.meta import meta_reader

IMAGE_TYPES = {"jpg": "jpeg", "jpeg": "jpeg", "png": "png", "webp": "webp", "gif": "gif"}
AUDIO_TYPES = {"wav": "wav", "flac": "flac", "mp3": "mpeg", "ogg": "ogg", "m4a": "mp4"}
VIDEO_EXTENSIONS = {"mp4", "mkv", "webm", "mov", "avi"}
TEXT_EXTENSIONS = {"txt", "json", "cls", "text", "caption"}
SIZE_SAMPLES = 2000  # samples per source whose sizes the histograms show
MEDIA_SAMPLES = 500  # samples per source whose media metadata the image histograms show
MEDIA_PROBE = 8  # a source whose first samples have no media metadata is taken to have none

ImageSizes = dict[str, list[tuple[int, int]]]  # part -> (width, height) per image


def build_report(
    config: str,
    settings: SimulationSettings,
    *,
    samples: int = 16,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> str:
    """The HTML page for ``config`` (see the module docstring)."""
    step = progress or (lambda _: None)
    step("simulating")
    sim = simulate(config, settings)
    dataset = build(config, settings, "train") or build(config, settings, "val")
    spec = dataset.spec
    rng = CounterRng(stable_seed(seed, "report"))
    step("decoding samples")
    grid_sizes: ImageSizes = {}
    picked = _pick(spec, rng, samples)
    cards = [_sample_card(spec, source, index, grid_sizes) for source, index in picked]
    step("plotting")
    drawn = _draw(spec, rng)
    plots = [
        ("Sample sizes", _size_histograms(spec, drawn)),
        ("Image sizes", _image_size_histograms(spec, drawn, grid_sizes)),
        ("Source shares over the first steps", _shares_plot(sim)),
        ("Samples drawn per shard in one epoch", _shard_plot(sim)),
    ]
    return _page(config, sim, cards, plots)


def _pick(spec: Any, rng: CounterRng, count: int) -> list[tuple[int, int]]:
    """``count`` random (source, index) pairs, taking the sources in turn so each is shown."""
    sources = [i for i, s in enumerate(spec.sources) if s.end > s.start]
    out = []
    for k in range(count if sources else 0):
        source = sources[k % len(sources)]
        s = spec.sources[source]
        out.append((source, s.start + rng.randbelow(s.end - s.start)))
    return out


# -- the sample grid --------------------------------------------------------------------------
def _sample_card(spec: Any, source: int, index: int, image_sizes: ImageSizes) -> str:
    """One sample of the grid; the sizes of its images are added to ``image_sizes``."""
    leaf = spec.sources[source].leaf
    meta = meta_reader(leaf)
    title = html.escape(f"{meta.key(index) or index} · {meta.shard_name(index)}")
    try:
        parts = _raw_parts(leaf, index, spec)
    except Exception as e:  # a broken sample is shown as such
        body = f'<p class="error">{html.escape(f"{type(e).__name__}: {e}")}</p>'
        return f'<div class="card"><h4>{title}</h4>{body}</div>'
    body = "".join(_render_part(name, value, image_sizes) for name, value in parts)
    return f'<div class="card"><h4>{title}</h4>{body}</div>'


def _raw_parts(leaf: Any, index: int, spec: Any) -> list[tuple[str, Any]]:
    """The sample's parts as stored (name, bytes); other leaf kinds: decoded fields."""
    read_members = getattr(leaf, "read_members", None)
    if read_members is not None:
        members, _, _ = read_members(index)
        return [(name.rpartition("/")[2].partition(".")[2], bytes(data)) for name, data in members]
    sample = leaf.load(index, spec.decoder, (0, index))
    fields = sample.items() if isinstance(sample, dict) else vars(sample).items()
    return [(k, v) for k, v in fields if not k.startswith("__")]


def _render_part(name: str, value: Any, image_sizes: ImageSizes) -> str:
    extension = name.rpartition(".")[2].lower()
    label = f'<div class="part">{html.escape(name)}</div>'
    if isinstance(value, bytes):
        if extension in IMAGE_TYPES:
            size = _image_size(value)
            if size is not None:
                image_sizes.setdefault(name, []).append(size)
            return label + _img(value, f"image/{IMAGE_TYPES[extension]}")
        if extension in AUDIO_TYPES:
            src = _data_uri(value, f"audio/{AUDIO_TYPES[extension]}")
            return label + f'<audio controls preload="none" src="{src}"></audio>'
        if extension in VIDEO_EXTENSIONS:
            thumb = _video_thumbnail(value)
            if thumb is None:
                return label + f"<p>video, {len(value)} bytes (no frame decoded)</p>"
            return label + _img(thumb, "image/png", "video thumbnail")
        if extension in TEXT_EXTENSIONS or extension.endswith("json"):
            return label + _text(value.decode("utf-8", errors="replace"))
        return label + f"<p>{len(value)} bytes</p>"
    if isinstance(value, str):
        return label + _text(value)
    if hasattr(value, "save") and hasattr(value, "size"):  # a PIL image
        image_sizes.setdefault(name, []).append(tuple(value.size))
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        return label + _img(buffer.getvalue(), "image/png")
    return label + _text(repr(value))


def _image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the image's header (no pixels decoded); None if unreadable."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            return int(image.width), int(image.height)
    except Exception:  # the card shows the image as stored; the histogram leaves it out
        return None


def _text(text: str, limit: int = 300) -> str:
    head = text[:limit] + ("…" if len(text) > limit else "")
    return f"<pre>{html.escape(head)}</pre>"


def _img(data: bytes, mime: str, alt: str = "sample image") -> str:
    return f'<img alt="{alt}" src="{_data_uri(data, mime)}">'


def _data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _video_thumbnail(data: bytes) -> bytes | None:
    try:
        import av
    except ImportError:
        return None
    try:
        with av.open(io.BytesIO(data)) as container:
            for frame in container.decode(video=0):
                buffer = io.BytesIO()
                frame.to_image().save(buffer, format="PNG")
                return buffer.getvalue()
    except Exception:  # an undecodable video gets no thumbnail, the card says so
        return None
    return None


# -- plots ------------------------------------------------------------------------------------
def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as e:
        raise MissingDependencyError(
            "energon report needs matplotlib (pip install energon[plot])"
        ) from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> str:
    plt = _pyplot()
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=80)
    plt.close(fig)
    return _img(buffer.getvalue(), "image/png", "plot")


def _draw(spec: Any, rng: CounterRng) -> list[list[int]]:
    """Up to :data:`SIZE_SAMPLES` random sample indices per source (for the histograms)."""
    drawn = []
    for source in spec.sources:
        count = min(SIZE_SAMPLES, source.end - source.start)
        drawn.append(
            [source.start + rng.randbelow(source.end - source.start) for _ in range(count)]
        )
    return drawn


def _size_histograms(spec: Any, drawn: list[list[int]]) -> str:
    """Bytes per part kind over the drawn samples (:func:`_draw`)."""
    by_part: dict[str, list[int]] = {}
    for source, indices in zip(spec.sources, drawn):
        reader = meta_reader(source.leaf)
        for index in indices:
            sizes = reader.part_sizes(index)
            if not sizes:
                size = reader.byte_range(index)[1]
                sizes = {"sample": size} if size is not None else {}
            for part, size in sizes.items():
                by_part.setdefault(part, []).append(size)
    if not by_part:
        return "<p>no sizes in the index</p>"
    plt = _pyplot()
    parts = sorted(by_part)
    fig, axes = plt.subplots(1, len(parts), figsize=(4 * len(parts), 3), squeeze=False)
    for ax, part in zip(axes[0], parts):
        ax.hist(by_part[part], bins=30, color="#1f77b4")
        ax.set_title(f"{part} ({len(by_part[part])} samples)")
        ax.set_xlabel("bytes")
    return _png(fig)


def _image_size_histograms(spec: Any, drawn: list[list[int]], grid: ImageSizes) -> str:
    """Widths and heights of images per part: from the media metadata of up to
    :data:`MEDIA_SAMPLES` drawn samples per source where the dataset has it, else from the
    images of the sample grid."""
    sizes = _media_image_sizes(spec, drawn)
    origin = "prepare's media metadata"
    if not sizes:
        sizes, origin = grid, "the images of the sample grid"
    if not sizes:
        return "<p>no images (and no image media metadata)</p>"
    plt = _pyplot()
    parts = sorted(sizes)
    fig, axes = plt.subplots(len(parts), 2, figsize=(8, 2.6 * len(parts)), squeeze=False)
    for row, part in zip(axes, parts):
        widths, heights = zip(*sizes[part])
        for ax, values, what in ((row[0], widths, "width"), (row[1], heights, "height")):
            ax.hist(values, bins=min(30, max(1, len(set(values)))), color="#2ca02c")
            ax.set_title(f"{part} {what} ({len(values)} images)")
            ax.set_xlabel("pixels")
    note = f"<p>From {html.escape(origin)}.</p>"
    return note + _png(fig)


def _media_image_sizes(spec: Any, drawn: list[list[int]]) -> ImageSizes:
    """(width, height) per image part from prepare's media metadata (images; video frames)."""
    from energon.format.media_metadata import AVMetadata, ImageMetadata

    found: ImageSizes = {}
    for source, indices in zip(spec.sources, drawn):
        reader = meta_reader(source.leaf)
        if not any(reader.media(index) for index in indices[:MEDIA_PROBE]):
            continue  # no media metadata in this source
        for index in indices[:MEDIA_SAMPLES]:
            for part, meta in reader.media(index).items():
                if isinstance(meta, ImageMetadata):
                    found.setdefault(part, []).append((meta.width, meta.height))
                elif isinstance(meta, AVMetadata) and meta.video_width and meta.video_height:
                    found.setdefault(part, []).append((meta.video_width, meta.video_height))
    return found


def _shares_plot(sim: Simulation) -> str:
    train = sim.train
    delivered = train.get("delivered") if train else None
    if not delivered or "windows" not in delivered or not delivered["windows"]:
        return "<p>no training split, or its order cannot be simulated</p>"
    plt = _pyplot()
    names = [s["name"] for s in train["sources"]]
    windows = [w for w in delivered["windows"] if sum(w["counts"]) == delivered["window"]]
    if not windows:  # fewer samples than one window
        windows = delivered["windows"]
    xs = [w["start"] for w in windows]
    fig, ax = plt.subplots(figsize=(8, 3))
    shared = "sizes" if "unit" in delivered else "counts"  # blend_by: shares of the size
    for i, name in enumerate(names):
        shares = [w[shared][i] / max(1, sum(w[shared])) for w in windows]
        ax.plot(xs, shares, marker="o", label=name)
    if sim.blend is not None:
        for i, source in enumerate(sim.blend.sources):
            ax.axhline(source["requested"], linestyle="--", color=f"C{i}", linewidth=0.8)
    ax.set_ylim(0, 1)
    ax.set_xlabel(f"global sample (windows of {delivered['window']})")
    ax.set_ylabel(f"share of {delivered.get('unit', 'samples')} (dashed: weight)")
    ax.legend(fontsize="small")
    return _png(fig)


def _shard_plot(sim: Simulation) -> str:
    if not sim.train:
        return "<p>no training split</p>"
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3))
    offset = 0
    for i, source in enumerate(sim.train["sources"]):
        drawn = [sh["drawn"] for sh in source["shards"]]
        ax.bar(range(offset, offset + len(drawn)), drawn, color=f"C{i}", label=source["name"])
        offset += len(drawn)
    ax.set_xlabel("shard")
    ax.set_ylabel("samples drawn")
    ax.legend(fontsize="small")
    return _png(fig)


# -- the page ---------------------------------------------------------------------------------
CSS = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(220px, 1fr)); gap: 10px; }
.card { border: 1px solid #ccc; border-radius: 6px; padding: 6px; overflow: hidden; }
.card h4 { margin: 0 0 4px; font-size: 12px; color: #555; }
.card img { width: 100%; max-width: 240px; display: block; }
.card pre, pre.figures { white-space: pre-wrap; font-size: 11px; background: #f6f6f6; padding: 4px; }
.part { font-size: 11px; color: #888; margin-top: 4px; }
.warnings li { color: #a40; }
.error { color: #a00; }
"""

SCRIPT = """
document.addEventListener("DOMContentLoaded", function () {
  document.body.dataset.ready = "1";
});
"""


def _page(config: str, sim: Simulation, cards: list[str], plots: list[tuple[str, str]]) -> str:
    title = f"energon report: {config}"
    warnings = (
        "<ul class='warnings'>"
        + "".join(f"<li>{html.escape(w)}</li>" for w in sim.warnings)
        + "</ul>"
        if sim.warnings
        else "<p>none</p>"
    )
    sections = "".join(f"<h2>{html.escape(name)}</h2>{body}" for name, body in plots)
    grid_images = sum(card.count("<img") for card in cards)  # the samples', not the plots
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{CSS}</style><script>{SCRIPT}</script></head>
<body>
<h1>{html.escape(title)}</h1>
<p id="image-count">{grid_images} images in the sample grid</p>
<h2>Warnings</h2>{warnings}
<h2>Samples</h2><div class="grid">{"".join(cards)}</div>
{sections}
<h2>Simulation</h2><pre class="figures">{html.escape(sim.text())}</pre>
</body></html>
"""
