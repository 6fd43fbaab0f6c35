"""Reference-style programs: metadatasets (V1, V2, epochized blends, subsets, nesting, joins, aux),
the CLI verbs as users call them, ``EPath``, file stores, media metadata and AV decoding (see
programs.py)."""

from tests.compat.programs import program

program("metadataset_v2_val_blend_concatenates")(
    """
ds = get_val_dataset(data["mds_val"], split_part="val", batch_size=None, worker_config=wc())
got = [[s.__key__, s.__subflavors__] for s in get_loader(ds)]
return [len(got), got[:3], got[-2:]]
"""
)

program("metadataset_v1_train_and_val", compare="blend_ratio_v1")(
    """
w = wc()
train = get_train_dataset(data["mds_v1"], batch_size=None, shuffle_buffer_size=None,
                          max_samples_per_sequence=None, worker_config=w)
it = iter(get_loader(train))
srcs = collections.Counter(next(it).__subflavors__["src"] for _ in range(600))
val = get_val_dataset(data["mds_v1"], split_part="val", batch_size=None, worker_config=w)
return {"a": srcs["a"], "b": srcs["b"], "val": sorted(s.__key__ for s in get_loader(val))}
"""
)

program("metadataset_epochized_blend_counts")(
    """
ds = get_train_dataset(data["mds_epoch"], batch_size=None, shuffle_buffer_size=None,
                       max_samples_per_sequence=None, worker_config=wc(), repeat=False)
got = [s.__key__ for s in get_loader(ds)]
counts = collections.Counter(got)
return [len(got), sorted(collections.Counter(counts.values()).items()),
        collections.Counter(k[0] for k in got)["a"], collections.Counter(k[0] for k in got)["b"]]
"""
)

program("metadataset_subsets")(
    """
w = wc()
train = get_train_dataset(data["mds_subset"], batch_size=None, shuffle_buffer_size=None,
                          max_samples_per_sequence=None, worker_config=w)
it = iter(get_loader(train))
seen = sorted({next(it).__key__ for _ in range(60)})
val = get_val_dataset(data["mds_subset"], split_part="val", batch_size=None, worker_config=w)
return [seen, [s.__key__ for s in get_loader(val)]]
"""
)

program("metadataset_nested_blend", compare="nested_blend")(
    """
ds = get_train_dataset(data["mds_nested"], batch_size=None, shuffle_buffer_size=None,
                       max_samples_per_sequence=None, worker_config=wc())
it = iter(get_loader(ds))
samples = [next(it) for _ in range(1000)]
srcs = collections.Counter(s.__subflavors__["src"] for s in samples)
nested = all(s.__subflavors__.get("nested") for s in samples if s.__subflavors__["src"] in ("a", "b"))
return {"a": srcs["a"], "b": srcs["b"], "b2": srcs["b2"], "nested": nested}
"""
)

program("metadataset_join_with_function_joiner")(
    """
sys.path.insert(0, data["root"])
import joinmod  # noqa: F401 - energon imports no module named in YAML that the program did not import
from megatron.energon.epathlib import EPath
prepare_metadataset(EPath(data["mds_join"]))
ds = get_val_dataset(data["mds_join"], split_part="train", batch_size=None, worker_config=wc())
got = [[s.__key__, s.text] for s in get_loader(ds)]
return [len(got), got[:3]]
"""
)

program("metadataset_join_in_training")(
    """
sys.path.insert(0, data["root"])
import joinmod  # noqa: F401 - energon imports no module named in YAML that the program did not import
from megatron.energon.epathlib import EPath
prepare_metadataset(EPath(data["mds_join"]))
ds = get_train_dataset(data["mds_join"], batch_size=4, shuffle_buffer_size=10, max_samples_per_sequence=None,
                       worker_config=wc())
it = iter(get_loader(ds))
batches = [next(it) for _ in range(15)]
texts = [t for b in batches for t in b.text]
return [all(t.split("|")[0].replace("b-text", "") == t.split("|")[1].replace("b-text", "") for t in texts),
        len(set(texts)) == 30]
"""
)

program("load_dataset_v1_and_subflavors")(
    """
ld = load_dataset(data["mds_v1"])
got = ld.get_datasets(training=True, split_part="train", worker_config=wc(), subflavors={"outer": 1})
return [type(ld).__name__, got.blend_mode.value,
        [[type(d.dataset).__name__, len(d.dataset), d.weight, d.dataset.subflavors] for d in got.datasets]]
"""
)

program("load_dataset_epochized")(
    """
got = load_dataset(data["mds_epoch"]).get_datasets(training=True, split_part="train", worker_config=wc())
return [got.blend_mode.value, [[len(d.dataset), d.repetitions, d.weight] for d in got.datasets]]
"""
)

program("traverse_metadataset_references")(
    """
refs = traverse_metadataset(data["mds_nested"], split_part="train")
return [[type(r).__name__, type(r.path).__name__, str(r.path).rsplit("/", 1)[-1], r.split_part, r.subflavors]
        for r in refs]
"""
)

program("get_val_datasets_of_a_plain_dataset")(
    """
out = get_val_datasets(data["a"], split_part="val", batch_size=5, worker_config=wc())
return [[len(ds), type(f).__name__, [keys(b) for b in get_loader(ds)][:2]] for ds, f in out]
"""
)

program("cli_info_and_lint")(
    """
from click.testing import CliRunner
from megatron.energon.cli.main import main
info = CliRunner().invoke(main, ["info", data["a"]])
lint = CliRunner().invoke(main, ["lint", data["b"], "--split-parts", "train"])
return [info.exit_code, "55" in info.output, "train" in info.output, lint.exit_code]
"""
)

program("cli_prepare_non_interactive")(
    """
import os, shutil, json as _json
from click.testing import CliRunner
from megatron.energon.cli.main import main
target = os.path.join(data["files"], "prep")
shutil.copytree(os.path.join(data["b"], "parts"), os.path.join(target, "parts"))
result = CliRunner().invoke(main, ["prepare", target, "--split-parts", "train:parts/data-[01].tar",
                                   "--split-parts", "val:parts/data-2.tar", "--num-workers", "1"], input="n\\n")
meta = os.path.join(target, ".nv-meta")
info = _json.load(open(os.path.join(meta, ".info.json")))
energon_only = {"shard_table.bin"}  # energon's addition to .nv-meta (docs/format.md)
return [result.exit_code, sorted(f for f in os.listdir(meta) if not f.startswith("index") and f not in energon_only), info["shard_counts"]]
"""
)

program("cli_checkpoint_redist_help")(
    """
from click.testing import CliRunner
from megatron.energon.cli.main import main
result = CliRunner().invoke(main, ["checkpoint", "--help"])
return [result.exit_code, "redist" in result.output]
"""
)

program("cli_preview_shows_samples")(
    """
from click.testing import CliRunner
from megatron.energon.cli.main import main
result = CliRunner().invoke(main, ["preview", data["b"], "--split-parts", "train"], input="n\\nn\\nn\\n")
return [result.exit_code in (0, 1), "b000" in result.output or "b-text" in result.output]
"""
)

program("epath_filesystem_operations")(
    """
from megatron.energon.epathlib import EPath
root = EPath(data["files"]) / "tree"
(root / "a").mkdir(exist_ok=True, parents=True)
(root / "a" / "x.bin").write_bytes(b"\\x00\\x01")
(root / "b.txt").write_text("b")
with (root / "c.txt").open("w") as f:
    f.write("c")
listing = sorted(p.name for p in root.glob("*"))
moved = root / "moved.txt"
(root / "c.txt").move(moved)
(root / "b.txt").copy(root / "d.txt")
(root / "b.txt").unlink()
walked = sorted(str(p.relative_to(root)) for p in root.walk())
return [listing, moved.read_text(), (root / "b.txt").is_file(), (root / "d.txt").read_text(),
        (root / "a" / "x.bin").read_bytes().hex(), str(EPath("relative/x")).endswith("relative/x"),
        sorted(p.name for p in root.glob("**/*.bin")), EPath(root / "a").is_dir(), EPath(str(root)) == root,
        walked, (root / "a" / "x.bin").size()]
"""
)

program("epath_url_forms")(
    """
from megatron.energon.epathlib import EPath
p = EPath("msc://__filesystem__" + data["files"] + "/hello.txt")
q = EPath(data["files"]) / "hello.txt"
return [p.read_text(), str(p) == str(q), p == q, p.is_local(), str(p.parent) == data["files"],
        p.with_suffix(".md").name, p.url == q.url, str(q.local_path) == str(q)]
"""
)

program("system_file_store_and_media")(
    """
store = SystemFileStore(data["images"])
raw, info = store["img2.png"]
path = store.get_path()
return [len(raw) > 0, info.index, str(path).endswith("images")]
"""
)

program("filesystem_media_metadata")(
    """
import os, shutil
from click.testing import CliRunner
from megatron.energon.cli.main import main
root = os.path.join(data["files"], "media")
shutil.copytree(data["images"], root)
result = CliRunner().invoke(main, ["prepare-media", root, "--media-metadata-by-extension", "--num-workers", "1"])
store = SystemFileStore(root)
meta = store.get_media_metadata("img3.png")
return [result.exit_code, type(meta).__name__, meta.width, meta.height]
"""
)

program("av_decoder_metadata_and_frames")(
    """
from megatron.energon.av import AVDecoder, get_clips_uniform, get_single_frames_uniform
decoder = AVDecoder(open(data["video"], "rb"))
meta = decoder.get_metadata()
frames = decoder.get_frames()
clips = get_clips_uniform(decoder, clip_duration_seconds=0.5, num_clips=3, request_video=True)
singles = get_single_frames_uniform(decoder, num_frames=4)
return [meta.video_fps, meta.video_num_frames, [meta.video_width, meta.video_height],
        list(frames.video_clips[0].shape), len(clips.video_clips), [list(c.shape) for c in clips.video_clips],
        list(singles.shape) if hasattr(singles, "shape") else type(singles).__name__,
        decoder.has_video_stream(), decoder.has_audio_stream()]
"""
)

program("av_decoder_clip_ranges")(
    """
from megatron.energon.av import AVDecoder
decoder = AVDecoder(open(data["video"], "rb"))
data_ = decoder.get_clips(video_clip_ranges=[(0, 4), (10, 14)], video_unit="frames")
video, timestamps = decoder.get_video_clips([(0.0, 0.5)], video_unit="seconds")
return [[list(c.shape) for c in data_.video_clips], [list(c.shape) for c in video],
        [[round(a, 3), round(b, 3)] for a, b in timestamps], decoder.get_video_fps()]
"""
)

program("sample_and_batch_dataclass_api")(
    """
import torch
a = TextSample(__key__="k1", __restore_key__=("x",), text="one")
b = TextSample(__key__="k2", __restore_key__=("y",), text="two")
batch = TextSample(__key__=[a.__key__, b.__key__], __restore_key__=(), text=[a.text, b.text])
@edataclass
class Pair(Batch):
    text: list
p = Pair.from_samples([a, b])
derived = TextSample.derive_from(a, text="changed")
return [p.__key__, p.text, derived.__key__, derived.text, derived.__restore_key__, batch.text,
        a.__subflavors__, sorted(f for f in TextSample.__dataclass_fields__)]
"""
)

program("prepare_metadataset_and_info_of_a_join")(
    """
sys.path.insert(0, data["root"])
import joinmod  # noqa: F401 - energon imports no module named in YAML that the program did not import
from click.testing import CliRunner
from megatron.energon.cli.main import main
result = CliRunner().invoke(main, ["prepare", data["mds_join"]])
ds = get_val_dataset(data["mds_join"], split_part="train", batch_size=6, worker_config=wc())
return [result.exit_code, len(list(get_loader(ds)))]
"""
)

program("source_info_module_helpers")(
    """
from megatron.energon.source_info import SourceInfo
ds = get_val_dataset(data["cap"], split_part="train", batch_size=2, worker_config=wc())
b = next(iter(get_loader(ds)))
flat = [s for per_sample in b.__sources__ for s in (per_sample if isinstance(per_sample, tuple) else [per_sample])]
return [type(b.__sources__).__name__, len(flat), [s.index for s in flat],
        sorted({s.shard_name for s in flat}), all(isinstance(s, SourceInfo) for s in flat)]
"""
)

program("format_sample_detailed_text")(
    """
from megatron.energon.sample_utils import format_sample_detailed
s = TextSample(__key__="k9", __restore_key__=(), text="hello world")
text = format_sample_detailed(s)
return ["k9" in text, "hello world" in text, "TextSample" in text]
"""
)
