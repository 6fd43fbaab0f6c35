"""Programs written against Megatron-Energon's public API (no energon names), run unchanged by the
reference in its side venv and by energon through ``import energon.megatron_alias``. This module
holds the registry and the first programs; ``THEMES`` name the modules holding the others.

Each program is the body of a function ``run(data) -> JSON-able result``; ``data`` holds the paths
of the shared datasets. ``COMPARE`` says how the two results must relate: ``"equal"`` (the
reference is deterministic there), or a named check for statistical or order-free results.
"""

from __future__ import annotations

PRELUDE = """
import json, sys, math, collections
from megatron.energon import *
from megatron.energon import WorkerConfig

def wc(workers=0, rank=0, world=1, seed=0):
    return WorkerConfig(rank=rank, world_size=world, num_workers=workers, seed_offset=seed)

def keys(batch):
    return list(batch.__key__) if isinstance(batch.__key__, (list, tuple)) else [batch.__key__]
"""

PROGRAMS: dict[str, str] = {}
COMPARE: dict[str, str] = {}
THEMES = (
    "programs_datasets",
    "programs_encoders",
    "programs_loaders",
    "programs_tools",
    "programs_surface",
    "programs_hand_written",
)


def load_all() -> None:
    """Register the programs of every theme module (each registers on import)."""
    import importlib

    for theme in THEMES:
        importlib.import_module(f"tests.compat.{theme}")


def program(name: str, compare: str = "equal"):
    def register(body: str) -> str:
        PROGRAMS[name] = body
        COMPARE[name] = compare
        return body

    return register


program("factory_val_order")(
    """
from megatron.energon.dataset_config import get_dataset_from_config
f = get_dataset_from_config(data["a"], split_part="train", training=False, worker_config=wc())
out = [[s.__key__, s.text] for s in get_loader(f.build())]
return {"type": type(f).__name__, "len": len(f), "samples": out}
"""
)

program("factory_val_two_workers")(
    """
from megatron.energon.dataset_config import get_dataset_from_config
w = wc(workers=2)
f = get_dataset_from_config(data["a"], split_part="train", training=False, worker_config=w)
return sorted(s.__key__ for s in get_loader(f.build()))
"""
)

program("map_filter_batch_val")(
    """
from megatron.energon.dataset_config import get_dataset_from_config
w = wc()
f = get_dataset_from_config(data["a"], split_part="train", training=False, worker_config=w)
ds = MapDataset(f.build(), lambda s: TextSample.derive_from(s, text=s.text.upper()), worker_config=w)
ds = FilterDataset(ds, filter_fn=lambda s: int(s.__key__[1:]) % 3 != 0, worker_config=w)
ds = BatchDataset(ds, 4, lambda xs: [x.text for x in xs], worker_config=w)
return {"len": len(ds), "batches": list(get_loader(ds))}
"""
)

program("concat_val")(
    """
from megatron.energon.dataset_config import get_dataset_from_config
w = wc()
fa = get_dataset_from_config(data["a"], split_part="train", training=False, worker_config=w)
fb = get_dataset_from_config(data["b"], split_part="train", training=False, worker_config=w)
ds = ConcatDataset(fa.build(), fb.build(), worker_config=w)
return {"len": len(ds), "keys": [s.__key__ for s in get_loader(ds)]}
"""
)

program("limit_val_repeats_same_batches")(
    """
w = wc()
val = get_val_dataset(data["a"], split_part="val", batch_size=2, worker_config=w)
ds = LimitDataset(RepeatDataset(val, worker_config=w), length=7, reset_after_epoch=True, worker_config=w)
loader = get_loader(ds)
passes = [[keys(b) for b in loader] for _ in range(2)]
return {"len": len(loader), "passes": passes}
"""
)

program("repeat_twice_val")(
    """
from megatron.energon.dataset_config import get_dataset_from_config
w = wc()
f = get_dataset_from_config(data["b"], split_part="train", training=False, worker_config=w)
ds = RepeatDataset(f.build(), repeats=2, worker_config=w)
seen = collections.Counter(s.__key__ for s in get_loader(ds))
return {"len": len(ds), "counts": sorted(set(seen.values())), "distinct": len(seen)}
"""
)

program("shuffle_buffer_pass_is_permutation")(
    """
from megatron.energon.dataset_config import get_dataset_from_config
w = wc()
f = get_dataset_from_config(data["a"], split_part="train", training=False, worker_config=w)
ds = ShuffleBufferDataset(f.build(), 10, worker_config=w)
got = [s.__key__ for s in get_loader(ds)]
return {"sorted": sorted(got), "len": len(ds)}
"""
)

program("blend_weights_statistics", compare="blend_ratio")(
    """
w = wc()
a = get_train_dataset(data["a"], batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None, worker_config=w)
b = get_train_dataset(data["b"], batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None, worker_config=w)
ds = BlendDataset((a, 1.0), (b, 4.0), worker_config=w)
assert isinstance(ds, BlendDataset)
weights = [wt for _, wt in ds.dataset_weights]
it = iter(get_loader(ds))
srcs = collections.Counter(next(it).__subflavors__["src"] for _ in range(1000))
return {"weights": weights, "a": srcs["a"], "b": srcs["b"]}
"""
)

program("mix_batch_homogeneous", compare="mix_ratio")(
    """
w = wc()
a = get_train_dataset(data["a"], batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=None, worker_config=w)
b = get_train_dataset(data["b"], batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=None, worker_config=w)
ds = MixBatchDataset((a, 2), (b, 8), batch_size=10, batch_mix_fn=homogeneous_concat_mix, worker_config=w)
it = iter(get_loader(ds))
sizes, srcs = [], collections.Counter()
for _ in range(50):
    batch = next(it)
    sizes.append(len(batch.__key__))
    flat = [sf for part in batch.__subflavors__ for sf in (part if isinstance(part, list) else [part])]
    srcs.update(sf["src"] for sf in flat)
return {"sizes": sorted(set(sizes)), "type": type(batch).__name__, "a": srcs["a"], "b": srcs["b"]}
"""
)

program("mix_batch_heterogeneous_lists")(
    """
w = wc()
a = get_train_dataset(data["a"], batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=None, worker_config=w)
ds = MixBatchDataset((a, 1), batch_size=3, worker_config=w)
batch = next(iter(get_loader(ds)))
return [type(batch).__name__, len(batch), type(batch[0]).__name__]
"""
)

program("custom_blending_task_encoder", compare="blend_ratio_te")(
    """
class TE(DefaultTaskEncoder):
    def build_train_datasets(self, *, datasets, worker_config, batch_size, batch_drop_last=False,
                             packing_buffer_size=None, virtual_epoch_length=0, shuffle_buffer_size=None,
                             blend_mode=None, repeat=True):
        ds = BlendDataset(
            *[(self.build_batch(RepeatDataset(self._load_dataset(d, 0, worker_config), worker_config=worker_config),
                                batch_size=batch_size, worker_config=worker_config), d.weight)
              for d in datasets],
            worker_config=worker_config,
        )
        if virtual_epoch_length > 0:
            ds = EpochizeDataset(ds, length=virtual_epoch_length, worker_config=worker_config)
        return ds
w = wc()
ds = get_train_dataset(data["mds"], batch_size=5, shuffle_buffer_size=None, max_samples_per_sequence=None,
                       worker_config=w, task_encoder=TE(), virtual_epoch_length=40)
loader = get_savable_loader(ds)
batches = list(loader)
pure = all(len({sf["src"] for sf in b.__subflavors__}) == 1 for b in batches)
srcs = collections.Counter(b.__subflavors__[0]["src"] for b in batches)
return {"len": len(loader), "n": len(batches), "pure": pure, "type": type(batches[0]).__name__,
        "a": srcs["a"], "b": srcs["b"]}
"""
)

program("epochize_length")(
    """
w = wc(workers=2)
ds = get_train_dataset(data["a"], batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=None, worker_config=w)
ds = EpochizeDataset(ds, 9, worker_config=w)
loader = get_loader(ds)
return [len(loader), len(list(loader)), len(list(loader))]
"""
)

program("load_dataset_metadataset")(
    """
w = wc()
ld = load_dataset(data["mds"])
got = ld.get_datasets(training=True, split_part="train", worker_config=w)
return {"loader": type(ld).__name__, "mode": got.blend_mode.value,
        "datasets": [[type(d.dataset).__name__, len(d.dataset), round(d.weight, 6)] for d in got.datasets]}
"""
)

program("load_dataset_plain")(
    """
w = wc()
ld = load_dataset(data["a"])
got = ld.get_datasets(training=False, split_part="val", worker_config=w)
return {"loader": type(ld).__name__, "mode": got.blend_mode.value,
        "lens": [len(d.dataset) for d in got.datasets], "sample_type": got.datasets[0].dataset.__sample_type__.__name__}
"""
)

program("get_dataset_from_config_subflavors")(
    """
from megatron.energon.dataset_config import get_dataset_from_config
f = get_dataset_from_config(data["a"], split_part="train", training=False, worker_config=wc(),
                            subflavors={"extra": 1})
s = next(iter(get_loader(f.build())))
return {"subflavors": s.__subflavors__, "sample_type": f.__sample_type__.__name__}
"""
)

program("crude_cooking_val")(
    """
@stateless
def cook(sample):
    return TextSample(**basic_sample_keys(sample), text="cooked:" + sample["txt"])
class TE(DefaultTaskEncoder):
    cookers = [Cooker(cook)]
ds = get_val_dataset(data["crude"], split_part="train", batch_size=3, worker_config=wc(), task_encoder=TE())
return [[keys(b), b.text] for b in get_loader(ds)]
"""
)

program("cache_pool_lazy_aux")(
    """
import tempfile
@stateless
@cooker(need_cache=True)
def cook(sample, other, cache):
    lazy = cache.get_lazy(other, sample["__key__"] + ".txt")
    return TextSample(**basic_sample_keys(sample), text=sample["txt"] + "|" + lazy.get(sample))
class TE(DefaultTaskEncoder):
    cookers = [Cooker(cook)]
import pathlib
pool = FileStoreCachePool(parent_cache_dir=pathlib.Path(tempfile.mkdtemp()), num_workers=2)
ds = get_val_dataset(data["crude_mds"], split_part="train", batch_size=2, worker_config=wc(), task_encoder=TE())
out = [[keys(b), b.text] for b in get_loader(ds, cache_pool=pool)]
pool.close()
return out
"""
)

program("no_cache_pool_direct_lazy")(
    """
pool = NoCachePool()
store = SystemFileStore(data["files"])
lazy = pool.get_lazy(store, "hello.txt")
direct = pool.get(store, "hello.txt")
mock = pool.to_cache({"x": 1}, "obj")
return [type(lazy).__name__, bytes(lazy.get()).decode(), bytes(direct).decode(), mock.get()]
"""
)

program("file_stores")(
    """
store = SystemFileStore(data["files"])
data_, info = store["hello.txt"]
ds_store = DecodeFileStore(SystemFileStore(data["files"]), decoder=SampleDecoder())
return [bytes(data_).decode(), info.index, ds_store.get("hello.txt")]
"""
)

program("epath_local")(
    """
from megatron.energon.epathlib import EPath, DEFAULT_PROFILE_NAME
root = EPath(data["files"])
p = root / "sub" / "x.txt"
p.write_text("hi")
assert (root / "sub").is_dir() and p.is_file()
with p.open("r") as f:
    content = f.read()
globbed = sorted(q.name for q in root.glob("*.txt"))
return {"name": p.name, "parent": str(p.parent) == str(root / "sub"), "read": p.read_text(),
        "open": content, "suffix": p.with_suffix(".json").name, "rel": str(p.relative_to(root)),
        "glob": globbed, "size": p.size(), "profile": DEFAULT_PROFILE_NAME,
        "local": p.is_local(), "eq": EPath(str(p)) == p, "abs": str(root / "/tmp") }
"""
)

program("edataclass_and_samples")(
    """
from megatron.energon.edataclass import edataclass as e2
import dataclasses
@edataclass
class MySample(Sample):
    value: int
s = MySample(__key__="k", __restore_key__=(), value=3)
t = MySample.derive_from(s, value=4)
return [e2 is edataclass, dataclasses.is_dataclass(s), t.value, t.__key__]
"""
)

program("sample_utils_compact")(
    """
from megatron.energon.sample_utils import format_sample_compact, default_get_batch_keys
s = TextSample(__key__="k1", __restore_key__=("x", "y"), __subflavors__={"a": "b"}, text="hello")
text = format_sample_compact(s)
return [text.startswith("TextSample("), "text='hello'" in text, "__key__='k1'" in text,
        default_get_batch_keys({"__key__": ["a", "b"]})]
"""
)

program("errors_module")(
    """
from megatron.energon.errors import FatalSampleError, SampleException, SkipSample as S2, SYSTEM_EXCEPTIONS
return [issubclass(FatalSampleError, SampleException), S2 is SkipSample, MemoryError in SYSTEM_EXCEPTIONS]
"""
)

program("group_batch_val")(
    """
from megatron.energon.dataset_config import get_dataset_from_config
w = wc()
f = get_dataset_from_config(data["a"], split_part="train", training=False, worker_config=w)
ds = GroupBatchDataset(f.build(), None, lambda s: (int(s.__key__[1:]) % 2, 3), lambda xs: [x.__key__ for x in xs], worker_config=w)
return list(get_loader(ds))
"""
)

program("packing_val")(
    """
from megatron.energon.dataset_config import get_dataset_from_config
w = wc()
f = get_dataset_from_config(data["a"], split_part="train", training=False, worker_config=w)
ds = PackingDataset(f.build(), 6, lambda xs: [xs[:2], xs[2:]], lambda xs: "+".join(x.__key__ for x in xs), worker_config=w)
return list(get_loader(ds))
"""
)

program("iter_map_pairs_val")(
    """
from megatron.energon.dataset_config import get_dataset_from_config
w = wc()
f = get_dataset_from_config(data["b"], split_part="train", training=False, worker_config=w)
def pairs(it):
    it = iter(it)
    for x in it:
        y = next(it, None)
        yield x.__key__ + ("" if y is None else "," + y.__key__)
ds = IterMapDataset(f.build(), pairs, len_map_fn=lambda n: (n + 1) // 2, worker_config=w)
return {"len": len(ds), "items": list(get_loader(ds))}
"""
)

program("val_datasets_with_factories")(
    """
out = get_val_datasets(data["mds"], split_part="train", batch_size=4, worker_config=wc())
return [[len(ds), type(f).__name__] for ds, f in out]
"""
)

program("module_paths_import")(
    """
import importlib
paths = ["megatron.energon.flavors.webdataset.config", "megatron.energon.flavors.webdataset.sample_decoder",
         "megatron.energon.wrappers.watchdog_dataset", "megatron.energon.cache.base",
         "megatron.energon.metadataset.loader_interface", "megatron.energon.metadataset.metadataset_v2",
         "megatron.energon.task_encoder.cooking", "megatron.energon.savable_loader", "megatron.energon.loader",
         "megatron.energon.source_info", "megatron.energon.media.filesystem_prepare", "megatron.energon.cli.main",
         "megatron.energon.tools.prepare", "megatron.energon.tools.info", "megatron.energon.tools.lint",
         "megatron.energon.tools.preview", "megatron.energon.tools.checkpoint"]
mods = [importlib.import_module(p) for p in paths]
from megatron.energon.flavors.webdataset.config import MAIN_FOLDER_NAME, SPLIT_YAML_FILENAME
from megatron.energon.metadataset.loader_interface import DatasetBlendMode
from megatron.energon.metadataset.metadataset_v2 import AuxFilesystemReference
from megatron.energon.wrappers.watchdog_dataset import WatchdogDataset
from megatron.energon.tools.prepare import command
return [MAIN_FOLDER_NAME, SPLIT_YAML_FILENAME, [m.value for m in DatasetBlendMode],
        callable(command), len(mods)]
"""
)

program("watchdog_wrapper_passes_samples")(
    """
from megatron.energon.wrappers.watchdog_dataset import WatchdogDataset
from megatron.energon.dataset_config import get_dataset_from_config
w = wc()
f = get_dataset_from_config(data["b"], split_part="train", training=False, worker_config=w)
ds = WatchdogDataset(f.build(), worker_config=w, timeout_seconds=30)
return [s.__key__ for s in get_loader(ds)]
"""
)

program("default_task_encoder_val_batches")(
    """
ds = get_val_dataset(data["a"], split_part="val", batch_size=4, worker_config=wc(), task_encoder=DefaultTaskEncoder())
loader = get_savable_loader(ds)
out = [[type(b).__name__, keys(b), b.text] for b in loader]
return {"len": len(loader), "batches": out, "config_type": loader.config()["type"]}
"""
)

program("savable_loader_resume_reference_api")(
    """
w = wc(workers=1)
def make():
    return get_savable_loader(get_train_dataset(data["a"], batch_size=3, shuffle_buffer_size=5,
                              max_samples_per_sequence=5, worker_config=w))
loader = make()
it = iter(loader)
for _ in range(4):
    next(it)
state = loader.save_state_rank()
expected = [keys(next(it)) for _ in range(4)]
resumed = make()
resumed.restore_state_rank(state)
it2 = iter(resumed)
return [keys(next(it2)) for _ in range(4)] == expected
"""
)

program("standard_factory_direct")(
    """
from megatron.energon.epathlib import EPath
f = StandardWebdatasetFactory(EPath(data["b"]), split_part="train", training=False, worker_config=wc(),
                              sample_type=TextSample, field_map={"text": "txt"}, subflavors={"x": 1})
samples = list(get_loader(f.build()))
return {"len": len(f), "first": [samples[0].__key__, samples[0].text, samples[0].__subflavors__],
        "n": len(samples), "isinstance": isinstance(f, BaseCoreDatasetFactory)}
"""
)

program("crude_factory_direct")(
    """
from megatron.energon.epathlib import EPath
f = CrudeWebdataset(EPath(data["crude"]), split_part="train", training=False, worker_config=wc())
s = next(iter(get_loader(f.build())))
return {"keys": sorted(k for k in s if not k.startswith("__restore")), "txt": s["txt"], "key": s["__key__"]}
"""
)

program("av_probe_index")(
    """
import io, av, numpy as np
from megatron.energon.av.av_reader import AVProbeIndex
buf = io.BytesIO()
out = av.open(buf, "w", format="mp4")
stream = out.add_stream("mpeg4", rate=10)
stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
stream.gop_size = 5
for i in range(23):
    frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), i * 7, np.uint8), format="rgb24")
    for packet in stream.encode(frame):
        out.mux(packet)
for packet in stream.encode():
    out.mux(packet)
out.close()
buf.seek(0)
index = AVProbeIndex(av.open(buf), 0)
entries = [[index[i].timestamp, index[i].is_keyframe] for i in range(len(index))]
return {"len": len(index), "entries": entries,
        "search": [index.search_timestamp(3000), index.search_timestamp(3000, backward=False),
                   index.search_timestamp(3000, any_frame=True)]}
"""
)
