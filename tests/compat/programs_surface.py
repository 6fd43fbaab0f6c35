"""Reference-style programs for the reference's module surface beyond its top-level names:
programmatic preparation, the CLI command objects under click's ``CliRunner``, ``epathlib``, the
cache pools, and the small modules (``rng``, ``savable``, ``watchdog``, ``bracecollapse``, ...) as
user code calls them (see programs.py). Each program works in its own folder below
``data["files"]``."""

from tests.compat.programs import program

# Writes tar shards with the standard library (as user scripts do); used by several programs.
WRITE_SHARDS = """
import io, os, tarfile
from pathlib import Path

def write_shards(root, shards):
    root = Path(root)
    for name, samples in shards.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(root / name, "w") as tar:
            for key, parts in samples:
                for ext, data in parts.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return root

def text_shards(prefix, n_shards, per_shard):
    return {
        f"parts/{prefix}-{s:02d}.tar": [
            (f"{prefix}{s:02d}_{i:03d}", {"txt": f"{prefix} {s} {i}".encode(), "json": b'{"i": %d}' % i})
            for i in range(per_shard)
        ]
        for s in range(n_shards)
    }

# energon's own addition to .nv-meta (docs/format.md): the reference does not write it
ENERGON_ONLY = {".nv-meta/shard_table.bin"}

def listing(root):
    root = Path(root)
    files = (str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    return sorted(f for f in files if f not in ENERGON_ONLY)
"""

program("prepare_dataset_programmatic")(
    WRITE_SHARDS
    + """
import yaml
from pathlib import Path
from megatron.energon.flavors import BaseWebdatasetFactory
root = write_shards(Path(data["files"]) / "wds", text_shards("s", 10, 3))
tars = sorted(str(p.relative_to(root)) for p in root.glob("**/*.tar"))
found = BaseWebdatasetFactory.prepare_dataset(
    root, tars, split_parts_ratio=[("train", 0.6), ("val", 0.2), ("test", 0.2)],
    progress_fn=lambda it, length=None: it, workers=2,
)
split = yaml.safe_load((root / ".nv-meta" / "split.yaml").read_text())
info = json.loads((root / ".nv-meta" / ".info.json").read_text())
(root / ".nv-meta" / "dataset.yaml").write_text(
    "sample_type:\\n  __module__: megatron.energon\\n  __class__: TextSample\\nfield_map:\\n  text: txt\\n"
)
val = get_val_dataset(str(root), split_part="val", batch_size=None, worker_config=wc())
idx = (root / "parts" / "s-00.tar.idx").read_bytes()
return {"found": sorted(found), "files": listing(root), "split": split,
        "counts": info["shard_counts"], "idx": list(idx),
        "val": [s.__key__ for s in get_loader(val)]}
"""
)

program("prepare_dataset_patterns_no_shuffle")(
    WRITE_SHARDS
    + """
import yaml
from pathlib import Path
from megatron.energon.flavors.webdataset.prepare import WebdatasetPreparator
root = write_shards(Path(data["files"]) / "wds_p", text_shards("q", 4, 2))
tars = sorted(str(p.relative_to(root)) for p in root.glob("**/*.tar"))
found = WebdatasetPreparator.prepare_dataset(
    root, tars, split_parts_patterns=[("train", "parts/q-0[0-2].tar"), ("val", "parts/q-03.tar")],
    shuffle_seed=None, split_config="custom.yaml", workers=1,
)
content = list(WebdatasetPreparator.iter_dataset_content(root / "parts" / "q-00.tar", extract_keys=("json",)))
return {"found": sorted(found), "files": listing(root),
        "split": yaml.safe_load((root / ".nv-meta" / "custom.yaml").read_text()),
        "content": [{k: v.decode() if v else v for k, v in c.items()} for c in content]}
"""
)

program("prepare_jsonl_programmatic")(
    """
from pathlib import Path
from megatron.energon.flavors import CrudeJsonlDatasetFactory
from megatron.energon.flavors.jsonl.jsonl_prepare import JsonlPreparator
path = Path(data["files"]) / "d.jsonl"
path.write_text("".join(json.dumps({"i": i, "text": f"t{i}"}) + "\\n" for i in range(7)))
count = CrudeJsonlDatasetFactory.prepare_dataset(path)
content = [c["json"].decode() for c in JsonlPreparator.iter_dataset_content(str(path))]
return {"count": count, "idx": list(Path(str(path) + ".idx").read_bytes()), "content": content}
"""
)

program("small_modules")(
    """
import warnings, time, threading
from megatron.energon.bracecollapse import collapse
from megatron.energon.deprecation import deprecated, warn_deprecated
from megatron.energon.rng import SystemRng, WorkerRng
from megatron.energon.savable import Savable
from megatron.energon.state import FlexState
from megatron.energon.watchdog import Watchdog, repr_short
names = [f"shard_{i:03d}.tar" for i in (0, 1, 2, 5, 6, 9)] + ["x.tar", "p_9.tar", "p_10.tar"]
out = {"collapse": collapse(names), "ordered": collapse(names, keep_order=True)}

@deprecated("use g")
def f(x):
    return x + 1

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out["f"] = f(1)
    warn_deprecated("old thing")
out["warnings"] = [(str(w.message), w.category.__name__) for w in caught]
out["seeds"] = [SystemRng.get_seed_from_args(1, 2), SystemRng.get_seed_from_args("a"), SystemRng.get_seed_from_args()]
rng = WorkerRng(wc())
first = rng.save_state()
draws = [rng.randbelow(1000) for _ in range(5)]
rng.restore_state(first)
out["rng_restores"] = draws == [rng.randbelow(1000) for _ in range(5)]
out["rng_state_is_flex"] = isinstance(first, FlexState) and isinstance(first, dict)
out["shuffle_is_permutation"] = sorted(rng.shuffle(list(range(10)))) == list(range(10))

class Counter(Savable):
    def __init__(self):
        self.n = 0
    def save_state(self):
        return FlexState(n=self.n)
    def restore_state(self, state):
        self.n = 0 if state is None else state["n"]

c = Counter(); c.n = 5; s = c.save_state(); c2 = Counter(); c2.restore_state(s)
out["savable"] = [c2.n, dict(s)]
try:
    Savable()
    out["abstract"] = False
except TypeError:
    out["abstract"] = True
out["repr_short"] = [repr_short("x" * 300), repr_short([1, 2])]
fired = threading.Event()
wd = Watchdog(timeout=0.05, callback=fired.set, dump_stacks=False, enabled=False)
items = list(wd.watch_iter(iter([1, 2, 3])))
time.sleep(0.2)
out["watch_iter_quiet"] = [items, fired.is_set()]
wd.enable()
out["fires"] = fired.wait(5.0)
wd.finish()
return out
"""
)

program("restore_key_helpers")(
    """
from megatron.energon.wrappers.base import add_sample_restore_key, get_sample_restore_key, SampleIndex
from megatron.energon.flavors.base_dataset import set_sample_restore_key
s = TextSample(__key__="k", __restore_key__=(), text="t")
add_sample_restore_key(s, 1, 2, src="X")
out = [list(get_sample_restore_key(s))]
set_sample_restore_key(s, 5, src=s)
out.append(list(s.__restore_key__))
d = {"__key__": "x"}
out.append(add_sample_restore_key(d, 3, src="Z"))
out.append(add_sample_restore_key(7, 3, src="Z"))
try:
    add_sample_restore_key(7, 3, src="Z", fail_otherwise=True)
except RuntimeError:
    out.append("raised")
index = SampleIndex(wc(), src=None)
out.append([index.get_next(), index.get_next(), index.save_state()])
index.restore_state(7)
out.append(index.get_next())
return out
"""
)

program("typed_converter_and_loaders")(
    """
import dataclasses, typing, os
from pathlib import Path
from megatron.energon.typed_converter import JsonParser, JsonValueError, to_json_object
from megatron.energon.module_loader import ModuleLoader
from megatron.energon.eyaml import load_yaml, load_yaml_json
from megatron.energon.epathlib import EPath
from megatron.energon.local_copy import ensure_local_copy
from megatron.energon.epathlib.rclone_config import read_rclone_config_at_path

@dataclasses.dataclass
class A:
    x: int
    y: typing.List[str] = dataclasses.field(default_factory=list)
    z: typing.Optional[float] = None

class NT(typing.NamedTuple):
    a: int
    b: str = "d"

p = JsonParser()
out = {"records": [repr(p.raw_to_typed({"x": 1, "z": 2}, A)), repr(p.raw_to_typed({"a": 1}, NT))]}
errors = []
for raw, tp in [({"x": "no"}, A), ({"x": 1, "w": 2}, A), ({"y": []}, A), (1.5, int), ("s", typing.List[int])]:
    try:
        p.raw_to_typed(raw, tp)
        errors.append("accepted")
    except JsonValueError as e:
        errors.append(str(e))
out["errors"] = errors
out["lenient"] = repr(JsonParser(strict=False).raw_to_typed({"x": 1, "w": 2}, A))
out["override"] = [repr(p.override(A(1, ["a"]), {"x": 5})), repr(p.override(NT(1), {"b": "zz"}))]
out["call"] = p.safe_call_function({"a": 3}, lambda a, b="q": [a, b])
out["json"] = [to_json_object(A(1, ["b"])), to_json_object(NT(2)), to_json_object(TextSample(__key__="k", __restore_key__=(), text="t"))]
folder = Path(data["files"]) / "mods"
folder.mkdir(exist_ok=True)
(folder / "m.py").write_text("def f(x):\\n    return x * 2\\ndef g():\\n    return 3\\n")
loader = ModuleLoader()
out["functions"] = [loader.get_function(str(folder / "m.py"), "f")(2), loader.get_function(f"{folder}/m.py:g")(),
                    loader.get_function("m.py:f", relative_path=EPath(folder))(5)]
try:
    loader.get_function(f"{folder}/m.py")
except ValueError:
    out["functions"].append("no name")
(folder / "c.yaml").write_text("a: 1\\nb: [x, y]\\n")
(folder / "c.json").write_text('{"j": [1, 2]}')
out["yaml"] = [load_yaml(b"a: 1\\nb: [1, 2]\\n"), load_yaml_json(EPath(folder / "c.yaml")), load_yaml_json(EPath(folder / "c.json"))]
out["local_copy"] = str(ensure_local_copy(EPath(folder / "c.yaml"))) == str(EPath(folder / "c.yaml"))
(folder / "rc.conf").write_text("[s3x]\\ntype = s3\\nprovider = AWS\\naccess_key_id = AK\\nsecret_access_key = SK\\nregion = us\\nendpoint = http://h\\n\\n[loc]\\ntype = local\\n")
out["rclone"] = {k: repr(v) for k, v in read_rclone_config_at_path(folder / "rc.conf").items()}
return out
"""
)

program("fork_hooks")(
    """
import os
from megatron.energon.fork_hook import ForkMixin, after_in_child_fork_hook, before_fork_hook, after_in_parent_fork_hook

events = []
class Handle(ForkMixin):
    def __before_fork__(self):
        events.append("obj-before")
    def __after_in_parent_fork__(self):
        events.append("obj-parent")
    def __after_in_child_fork__(self):
        os.write(w, b"obj-child;")

def child_hook():
    os.write(w, b"fn-child;")

def before():
    events.append("fn-before")

r, w = os.pipe()
h = Handle()
after_in_child_fork_hook(child_hook)
before_fork_hook(before)
after_in_parent_fork_hook(lambda: events.append("lambda-parent"), make_persistent=True)
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
os.close(w)
child = os.read(r, 1000).decode()
return {"parent": sorted(events), "child": sorted(child.strip(";").split(";"))}
"""
)

# A module for the worker processes (a spawned process imports it; user modules import the alias
# themselves where energon is used).
EPATH_WORKER = """
try:
    import energon.megatron_alias
except ImportError:
    pass

def epath_worker(path):
    from megatron.energon.epathlib import EPath
    p = EPath(path)
    return [sorted(str(x.relative_to(p)) for x in p.glob("**/*")), [str(x.relative_to(p)) for x in p.walk()],
            (p / "a.txt").read_text(), (p / "a.txt").stat().content_length, (p / "sub").stat().type]
"""

program("epath_listing_stat_processes")(
    """
import multiprocessing, pickle, os
from pathlib import Path
import megatron.energon.epathlib as epathlib
import megatron.energon.epathlib.epath as epath_module
from megatron.energon.epathlib import EPath, DEFAULT_PROFILE_NAME
root = Path(data["files"]) / "ep"
(root / "sub" / "deep").mkdir(parents=True, exist_ok=True)
(root / "a.txt").write_text("a\\n")
(root / "sub" / "b.txt").write_text("bb\\n")
(root / "sub" / "deep" / "c.tar").write_text("c")
(root / "sub" / ".hidden").write_text("")
p = EPath(root)
rel = lambda xs: [str(x.relative_to(p)) for x in xs]
stat = (p / "a.txt").stat()
dstat = (p / "sub").stat()
out = {
    "attrs": [epath_module.NVDATASET_CACHE_DIR, epath_module.RESERVED_POSIX_PROFILE_NAME, DEFAULT_PROFILE_NAME,
              epathlib.EPath is epath_module.EPath],
    "glob": [rel(p.glob("*")), rel(p.glob("**/*")), rel(p.glob("**/*.tar")), rel(p.glob("sub/*.txt")), rel(p.glob("nomatch*"))],
    "walk": rel(p.walk()),
    "stat": [type(stat).__name__, stat.key.endswith("ep/a.txt"), stat.content_length, stat.type, stat.etag,
             type(stat.last_modified).__name__, str(stat.last_modified.tzinfo), dstat.key.endswith("ep/sub/"), dstat.content_length, dstat.type],
    "size": (p / "sub" / "b.txt").size(),
    "names": [p.name, str(p.parent) == str(root.parent), str((p / "a.txt").with_suffix(".md"))[-7:], p.is_local(),
              p.profile, str(p.url) == str(root), str(p.local_path()) == str(root), str(EPath("msc://__filesystem__" + str(root))) == str(root)],
    "joins": [str(EPath("/tmp") / EPath("/abs")), str(EPath("/tmp/x/../y"))],
    "pickle": str(pickle.loads(pickle.dumps(p))) == str(root),
}
try:
    (p / "nope").stat()
except FileNotFoundError:
    out["missing"] = "FileNotFoundError"
(p / "w").mkdir()
(p / "w" / "x.txt").write_text("hi")
with (p / "w" / "y.bin").open("wb") as f:
    f.write(b"12")
(p / "w" / "y.bin").copy(p / "w" / "z.bin")
(p / "w" / "z.bin").move(p / "w" / "z2.bin")
out["ops"] = [sorted(os.listdir(root / "w")), (p / "w" / "z2.bin").read_bytes().decode()]
(p / "w" / "z2.bin").unlink()
out["after_unlink"] = sorted(os.listdir(root / "w"))
for name in ("x.txt", "y.bin"):
    (p / "w" / name).unlink()
(root / "w").rmdir()
import sys
(Path(data["files"]) / "epath_worker_mod.py").write_text(EPATH_WORKER_SRC)
sys.path.insert(0, data["files"])
import epath_worker_mod
results = {}
for method in ("fork", "spawn"):
    with multiprocessing.get_context(method).Pool(1) as pool:
        results[method] = pool.apply_async(epath_worker_mod.epath_worker, (str(root),)).get(timeout=300)
out["processes"] = results
return out
""".replace("EPATH_WORKER_SRC", repr(EPATH_WORKER))
)

program("file_cache_pool_behaviour")(
    """
from pathlib import Path
from megatron.energon.cache import FileStoreCachePool, NoCachePool, SystemFileStore, DecodeFileStore, MockLazy, DirectLazy, FileCacheLazy
from megatron.energon.cache.file_cache_pool import CacheFileLazy
folder = Path(data["files"]) / "aux"
folder.mkdir(exist_ok=True)
(folder / "f1.txt").write_text("hello")
(folder / "f2.bin").write_bytes(b"world")
store = SystemFileStore(str(folder))
decoded = DecodeFileStore(store, decoder=SampleDecoder())

def src(sample):
    return [[Path(str(s.dataset_path)).name, s.index, Path(str(s.shard_name)).name, list(s.file_names)] for s in sample.__sources__ or ()]

out = {}
for method in ("raw", "pickle"):
    pool = FileStoreCachePool(parent_cache_dir=Path(data["files"]) / f"cache_{method}", num_workers=2, method=method)
    s = TextSample(__key__="k", __restore_key__=(), text="t")
    got = {"get": pool.get(store, "f1.txt", s).decode(), "get_sources": src(s)}
    l1, l2 = pool.get_lazy(store, "f1.txt"), pool.get_lazy(store, "f1.txt")
    other = pool.get_lazy(store, "f2.bin")
    got["lazies"] = [type(l1).__name__, l1 == l2, l1 is l2, hash(l1) == hash(l2), l1 == other, l1.fname, l1.ds is store, l1.pool is pool]
    a = TextSample(__key__="a", __restore_key__=(), text="t")
    b = TextSample(__key__="b", __restore_key__=(), text="t")
    got["shared"] = [l1.get(a).decode(), l2.get(b).decode(), src(a), src(b), other.get().decode()]
    d = pool.get_lazy(decoded, "f1.txt")
    value = d.get()
    got["decoded"] = [value, type(value).__name__]
    for data_ in (b"rawbytes", {"x": [1, 2]}):
        c = pool.to_cache(data_, "myname")
        got.setdefault("to_cache", []).append([type(c).__name__, isinstance(c, CacheFileLazy), c.fname, c.ds, repr(c.get()), repr(c.get())])
    pool.close()
    out[method] = got
none = NoCachePool()
lazy = none.get_lazy(store, "f2.bin")
s = TextSample(__key__="n", __restore_key__=(), text="t")
mock = none.to_cache(b"x", "n")
out["none"] = [type(lazy).__name__, lazy.get(s).decode(), src(s), none.get(store, "f2.bin").decode(),
               type(mock).__name__, mock.get(), mock.fname, lazy == none.get_lazy(store, "f2.bin")]
m = MockLazy("fname", lambda fname: fname.upper())
out["mock"] = [m.get(), m.ds, m.pool, m.fname]
return out
"""
)

program("sample_utils_formats")(
    """
import dataclasses
import numpy as np
import torch
from megatron.energon.sample_utils import default_get_batch_keys, format_sample_compact, format_sample_detailed

@dataclasses.dataclass
class MyBatch(Batch):
    x: torch.Tensor
    keys: list

cap = CaptioningSample(__key__="k1", __restore_key__=("Webdataset", 0, 1), __subflavors__={"a": 1},
                       image=torch.zeros(3, 4, 5), caption="hello world")
batch = MyBatch(__key__=["a", "b"], __restore_key__=(), x=torch.ones(2, 2), keys=["a", "b"])
values = [
    cap, batch, list(range(30)), {i: i for i in range(30)}, "plain", 5, None, b"\\x00" * 100,
    {"f": 1.5, "b": True, "n": None, "l": [[1, 2], (3, 4)], "t": (1, "a"), "s": "q" * 300},
    {"t": torch.arange(6).reshape(2, 3).float(), "n": np.ones((2, 2)), "i": np.arange(7), "b": torch.zeros(2, dtype=torch.bool)},
    [torch.tensor(3.0), torch.zeros(0), np.array(["a", "b"]), np.float32(3), torch.arange(10).to(torch.int32)],
    {"a": {"b": {"c": {"d": {"e": 1}}}}},
]
out = {"detailed": [format_sample_detailed(v) for v in values], "compact": [format_sample_compact(v) for v in values]}
out["options"] = [format_sample_detailed({"a": [1, 2]}, indent="  "), format_sample_compact([[[[[1]]]]]),
                  format_sample_compact({"a": [1, {"b": (2, [3])}]}, depth=2), format_sample_compact("y" * 60, max_str_len=10),
                  format_sample_compact(list(range(5)), max_items=2)]
t = TextSample(__key__="k", __restore_key__=(), text="t")
out["keys"] = [default_get_batch_keys(x) for x in (cap, batch, [batch], [t, t], {"__key__": "x"}, {"a": 1}, [{"__key__": "a"}], 5, ["a"])]
return out
"""
)

program("webdataset_internals")(
    WRITE_SHARDS
    + """
import threading
from pathlib import Path
from megatron.energon.epathlib import EPath
from megatron.energon.flavors import BaseWebdatasetFactory
from megatron.energon.flavors.webdataset import metadata, sharder, field_access, itar, itar_reader, indexing, structs
from megatron.energon.flavors.webdataset.thread_local_sqlite import ThreadLocalSqlite
root = write_shards(Path(data["files"]) / "wds_i", text_shards("z", 3, 4))
tars = sorted(str(p.relative_to(root)) for p in root.glob("**/*.tar"))
BaseWebdatasetFactory.prepare_dataset(root, tars, split_parts_ratio=[("train", 1)], shuffle_seed=None, workers=1)
p = EPath(root)
out = {}
info = metadata.get_dataset_info(p)
meta = metadata.WebdatasetMeta.from_config(p, split_part="train")
out["metadata"] = [info["shard_counts"], metadata.check_dataset_info_present(p), metadata.check_dataset_info_present(EPath(data["files"])),
                   metadata.get_dataset_type(p).name, metadata.get_dataset_type(EPath(data["jsonl"])).name, metadata.get_dataset_type(EPath(data["mds"])).name,
                   metadata.get_dataset_type(EPath(data["files"])).name, metadata.get_info_shard_files(p),
                   [[s.name, s.count, str(s.path) == str(p / s.name)] for s in meta.shards], meta.split_part_files, sorted(meta.sample_excludes)]
slices = []
for rank, world, workers in ((0, 2, 2), (1, 2, 2), (0, 1, 0), (2, 3, 2)):
    w = WorkerConfig(rank=rank, world_size=world, num_workers=workers)
    slices.append([sharder.Sharder.slice_workers(100, w, max_samples_per_sequence=None),
                   sharder.Sharder.slice_workers(100, w, max_samples_per_sequence=10),
                   sharder.Sharder.slice_workers(100, w, max_samples_per_sequence=7, subset=structs.DatasetSubset(range=(0.25, 0.9))),
                   sharder.Sharder.split_samples_to_workers(0, 100, w, rotation_offset=1),
                   sharder.Sharder.shard_workers(meta.shards, w, max_samples_per_sequence=3)])
out["slices"] = slices
out["subset"] = [structs.DatasetSubset(range=(0.2, 0.8)).compute_subset(100), structs.DatasetSubset(absolute_range=(10, None), range=(0.5, 1.0)).compute_subset(100)]
fa = field_access.split_field_access("txt,json[t][1][x]")
out["field_access"] = [fa, field_access.field_access({"json": {"t": [1, {"x": 2}]}}, fa), field_access.field_access({"txt": 3}, fa)]
try:
    field_access.field_access({"a": 1}, field_access.split_field_access("x,y"))
except field_access.FieldAccessError as e:
    from megatron.energon.errors import SampleException
    out["field_access"].append([str(e), isinstance(e, SampleException)])
shard = p / "parts" / "z-01.tar"
reader = itar.TarIndexReader(shard)
out["itar"] = [len(reader), list(reader), itar.get_itar_byte_offset(shard, 2), itar.CachedItarOffsetReader().get_itar_byte_offset(shard, 3)]
with itar.open_itar(shard, byte_offset=reader[1], byte_size=reader[2] - reader[1]) as tar:
    out["itar"].append([m.name for m in tar.getmembers()])
with open(str(shard), "rb") as f:
    with itar.ITarFile.open(fileobj=f, mode="r:") as tar:
        tar.offset = reader[2]
        member = tar.next()
        out["itar"].append([member.name, tar.extractfile(member).read().decode()])
    sub = itar.SubFileReader(f, 512, 6)
    out["itar"].append([sub.read().decode(), sub.tell(), sub.seek(2), sub.read(2).decode()])
def plain(sample):  # each side prepares its own copy: the sources name it "<files>"
    return None if sample is None else {k: (v.decode() if isinstance(v, bytes) else str(v).replace(data["files"], "<files>") if k == "__sources__" else v) for k, v in sample.items()}
by_index = itar_reader.ShardInfosITarReader(p, meta.shards)
txt_only = itar_reader.ShardInfosITarReader(p, meta.shards, part_filter=lambda part: part == "txt")
out["readers"] = [len(by_index), plain(by_index[0]), plain(by_index[9]), plain(txt_only[5])]
try:
    by_index[12]
except IndexError:
    out["readers"].append("IndexError")
by_key = itar_reader.SqliteITarEntryReader(p)
entries = itar_reader.SqliteITarEntryReader(p, key_is_full_entryname=True)
data_, source = entries["z01_002.json"]
out["by_key"] = [len(by_key), plain(by_key["z02_001"]), data_.decode(), [str(source.dataset_path) == str(p), source.index, source.shard_name, list(source.file_names)],
                 list(by_key.list_all_samples())[:3], list(by_key.list_all_sample_parts())[:3], list(by_key.list_sample_parts("z00_003")), by_key.get_total_size()]
for bad in ("z00_000.txt",):
    try:
        by_key[bad]
    except KeyError:
        out["by_key"].append("KeyError")
index = indexing.SqliteIndexReader(p / ".nv-meta" / "index.sqlite")
out["index"] = [index.db_has_sample_parts(), index.db_has_media_metadata(), index.get_sample_count(), index.get_total_size(),
                repr(index.get_sample_pointer_by_key("z01_001")), repr(index.get_sample_part("z01_001", "json"))]
jpath = EPath(Path(data["files"]) / "join.bin")
writer = indexing.JoinIndexWriter(jpath)
writer.append((0, 0, 10), (1, 20, 30))
writer.append((2, 5, 6), (-1, -1, -1))
writer.close()
jr = indexing.JoinIndexReader(jpath)
column = indexing.JoinIndexReader(jpath, column=1)
out["join"] = [len(jr), jr[0], jr[1], [column[0], column[1]], list(indexing.JoinIndexReader(jpath).get_as_tensor().shape), (Path(data["files"]) / "join.bin").read_bytes().hex()]
rpath = EPath(Path(data["files"]) / "join_real.bin")
writer = indexing.JoinIndexWriter(rpath)
writer.append((0, 0, 1), (1, reader[1], reader[2] - reader[1]))
writer.append((0, 0, 1), (-1, -1, -1))
writer.close()
joined = itar_reader.JoinIndexFileITarReader(rpath, 1, tars, p)
out["join"].append([len(joined), plain(joined[0])])
tw = itar.TarIndexWriter(EPath(Path(data["files"]) / "x.tar"))
for offset in (0, 1024, 4096):
    tw.append(offset)
tw.close()
out["tar_index_writer"] = (Path(data["files"]) / "x.tar.idx").read_bytes().hex()
db = ThreadLocalSqlite(str(p / ".nv-meta" / "index.sqlite"))
counts = []
threads = [threading.Thread(target=lambda: counts.append(db.select_one("SELECT COUNT(*) FROM samples")[0])) for _ in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
out["thread_local"] = [counts, len(db.select_all("SELECT sample_key FROM samples"))]
return out
"""
)

program("jsonl_internals")(
    """
from pathlib import Path
from megatron.energon.epathlib import EPath
from megatron.energon.flavors import CrudeJsonlDatasetFactory
from megatron.energon.flavors.jsonl import ijsonl, ijsonl_reader
path = Path(data["files"]) / "j.jsonl"
path.write_text("".join(json.dumps({"i": i}) + "\\n" for i in range(4)))
CrudeJsonlDatasetFactory.prepare_dataset(path)
p = EPath(path)
r = ijsonl.IJsonlIndexReader(p)
c = ijsonl.CachedIJsonlOffsetReader(p)
out = {"index": [len(r), r[0], r[2], ijsonl.IJsonlIndexReader.count_samples(p), ijsonl.IJsonlIndexReader.size(p),
                 c.get_ijsonl_byte_offset(1), c.get_total_size(), ijsonl.IJSONL_SUFFIX]}
with open(path, "rb") as f:
    jf = ijsonl.IJsonlFile(f)
    first = jf.next()
    jf.seek(r[2])
    out["file"] = [first.decode(), jf.next().decode()]
reader = ijsonl_reader.IJsonlReader(p)
data_, source = reader["3.json"]
# (the reference lists the keys of lines 0..n-1 as 1..n, which are not its entry names: left out)
out["reader"] = [data_.decode(), [str(source.dataset_path) == str(p), source.index, source.shard_name, list(source.file_names)],
                 list(reader.list_sample_parts("1")), reader.get_total_size()]
w = ijsonl.IJsonlIndexWriter(EPath(Path(data["files"]) / "w.jsonl"))
for offset in (0, 5, 9):
    w.append(offset)
w.close()
out["writer"] = (Path(data["files"]) / "w.jsonl.idx").read_bytes().hex()
return out
"""
)

program("cli_command_objects_with_clirunner")(
    WRITE_SHARDS
    + """
import os, torch
from pathlib import Path
from click.testing import CliRunner
from megatron.energon.cli.main import main, prepare_command, prepare_media_command, info_command
from megatron.energon.tools.checkpoint import command_redist, command_info
from megatron.energon.tools.prepare import command as tools_prepare
runner = CliRunner()
out = {"same_objects": [tools_prepare is prepare_command]}
root = write_shards(Path(data["files"]) / "cli_wds", text_shards("c", 4, 3))
result = runner.invoke(prepare_command, [str(root), "--non-interactive", "--split-ratio", "0.5,0.5,0", "--skip-dataset-yaml", "--no-progress"])
out["prepare"] = [result.exit_code, listing(root)]
result = runner.invoke(main, ["prepare", str(root), "--non-interactive", "--split-ratio", "1,0,0", "--skip-dataset-yaml", "--force-overwrite", "--no-progress"])
out["prepare_again"] = result.exit_code
media = Path(data["files"]) / "media"
media.mkdir(exist_ok=True)
from PIL import Image
Image.new("RGB", (5, 3), (10, 20, 30)).save(media / "a.png")
(media / "b.txt").write_text("not media")
result = runner.invoke(prepare_media_command, [str(media), "--media-metadata-by-extension", "--no-progress"])
# (energon also writes .nv-meta/index.uuid, which the reference writes only for WebDatasets)
out["prepare_media"] = [result.exit_code, [f for f in listing(media) if f != ".nv-meta/index.uuid"]]
result = runner.invoke(main, ["--help"])
out["help"] = [result.exit_code, all(v in result.output for v in ("prepare", "checkpoint", "lint", "info", "preview", "prepare-media", "mount"))]
(root / ".nv-meta" / "dataset.yaml").write_text(
    "sample_type:\\n  __module__: megatron.energon\\n  __class__: TextSample\\nfield_map:\\n  text: txt\\n"
)
w = WorkerConfig(rank=0, world_size=2, num_workers=0)
states = []
for rank in range(2):
    wr = WorkerConfig(rank=rank, world_size=2, num_workers=0)
    ds = get_train_dataset(str(root), batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=None, worker_config=wr)
    loader = get_savable_loader(ds)
    it = iter(loader)
    for _ in range(2):
        next(it)
    state = loader.save_state_rank()
    path = Path(data["files"]) / f"state_r{rank}.pt"
    torch.save(state, path)
    states.append(str(path))
target = Path(data["files"]) / "redist"
target.mkdir(exist_ok=True)
result = runner.invoke(command_redist, [*states, str(target), "--new-world-size", "1"])
out["redist"] = [result.exit_code, sorted(os.listdir(target)) if target.exists() else None]
result = runner.invoke(command_info, states)
out["checkpoint_info"] = result.exit_code
return out
"""
)

program("media_metadata_api")(
    """
import io
from pathlib import Path
from PIL import Image
from megatron.energon.media.extractor import MediaFilterConfig, MediaFilterStrategy
from megatron.energon.media import MediaMetadataType, ImageMetadata, AVMetadata
buf = io.BytesIO()
Image.new("RGB", (5, 3)).save(buf, format="PNG")
folder = Path(data["files"]) / "media_api"
folder.mkdir()
(folder / "a.png").write_bytes(buf.getvalue())
(folder / "b.txt").write_bytes(buf.getvalue())
(folder / "c.jpg").write_bytes(b"not an image")
def plain(meta):
    return None if meta is None else [type(meta).__name__, meta.metadata_type.value, meta.width, meta.height, meta.format, meta.mode]
out = {"strategies": [s.value for s in MediaFilterStrategy],
       "types": [MediaMetadataType.from_string("image").name, MediaMetadataType.from_string("av").name, ImageMetadata.metadata_type.name, AVMetadata.metadata_type.name]}
try:
    MediaMetadataType.from_string("IMAGE")
except ValueError:
    out["types"].append("ValueError")
# GLOB is left out of extract_metadata: the reference fails every glob-matched file there (migrating.md)
for config in (MediaFilterConfig.parse(None, False, True), MediaFilterConfig.parse("*.png,*.txt", False, False), MediaFilterConfig.parse(None, True, False)):
    row = [config.strategy.value, list(config.patterns), config.should_consider_all(),
           [config.should_consider_media(n) for n in ("a.png", "b.txt", "x.mp4", "X.PNG", "noext")]]
    if config.strategy is not MediaFilterStrategy.GLOB:
        for name in ("a.png", "b.txt", "c.jpg"):
            with open(folder / name, "rb") as f:
                row.append([plain(config.extract_metadata(folder / name)), plain(config.extract_metadata((folder / name).read_bytes(), name)), plain(config.extract_metadata(f, name))])
    out[config.strategy.value] = row
return out
"""
)

program("handlers_by_keyword")(
    """
from megatron.energon.errors import log_exception, reraise_exception
from megatron.energon.wrappers.map_dataset import handle_restore_errors
from megatron.energon.task_encoder.base import get_failure_tolerance, stateless
out = {}
log_exception(e=ValueError("logged"), sample={"__key__": "k"}, sources=None)
try:
    reraise_exception(e=KeyError("raised"), _sample=None)
except KeyError as e:
    out["reraise"] = str(e)
seen = []
with handle_restore_errors(error_handler=lambda e, *rest: seen.append([type(e).__name__, str(e), list(rest)]), sample="s1"):
    raise IndexError("while restoring")
out["restore"] = seen
def plain(x):
    return x
@stateless(failure_tolerance=3)
def tolerant(x):
    return x
from megatron.energon.errors import SampleException
from megatron.energon import TextSample
class MyError(SampleException):
    pass
errors = [SampleException.from_sample({"__key__": "k1", "x": 1}, "bad value"), SampleException.from_sample("raw"),
          MyError.from_sample(TextSample(__key__="k", __restore_key__=(), text="hello"), "m")]
out["from_sample"] = [[type(e).__name__, str(e)] for e in errors]
out["tolerance"] = [get_failure_tolerance(plain), get_failure_tolerance(plain, 5), get_failure_tolerance(plain, default_failure_tolerance=7),
                    get_failure_tolerance(tolerant), get_failure_tolerance(tolerant, default_failure_tolerance=7)]
return out
"""
)

program("guessing_handler_wrapper")(
    """
import io
from PIL import Image
from megatron.energon.flavors.webdataset.sample_decoder import GuessingHandlerWrapper
def encoded(fmt):
    buf = io.BytesIO()
    Image.new("RGB", (5, 3)).save(buf, format=fmt)
    return buf.getvalue()
def handler(key, data):
    return [key, len(data)]
wrapped = GuessingHandlerWrapper.wrap(True, [handler])
out = [len(wrapped), GuessingHandlerWrapper.wrap(False, [handler]) == [handler]]
for key, data in (("x.bin", encoded("PNG")), ("y", encoded("JPEG")), ("z.txt", b"hello"), ("a.png", encoded("PNG")), ("b", b"{}")):
    out.append(wrapped[0](key, data))
return out
"""
)

program("aux_references")(
    """
from pathlib import Path
from megatron.energon.epathlib import EPath
from megatron.energon.metadataset.metadataset_v2 import AuxDatasetReference, AuxFilesystemReference
root = Path(data["root"])
mds = EPath(root / "meta" / "m.yaml")
out = []
for cls, field, path in ((AuxDatasetReference, "path", "../a"), (AuxDatasetReference, "path", str(root / "a")),
                         (AuxFilesystemReference, "fs_path", "media"), (AuxFilesystemReference, "fs_path", "/abs/y"),
                         (AuxDatasetReference, "path", "missing")):
    ref = cls(**{field: path})
    try:
        ref.post_initialize(mds)
        value = getattr(ref, field)
        out.append([type(value).__name__, str(value).replace(str(root), "<root>")])
    except Exception:
        out.append("error")
try:
    AuxFilesystemReference(fs_path="x").post_initialize()
except Exception:
    out.append("error without mds_path")
return out
"""
)

program("dataset_level_members")(
    """
out = {}
for name, batch in (("samples", None), ("batches", 4)):
    config = wc(workers=2)
    ds = get_val_dataset(data["a"], split_part="val", batch_size=batch, worker_config=config)
    out[name] = [len(ds), ds.len_worker(0), ds.len_worker(1), ds.can_restore_sample()]
    ds.assert_can_restore()
    # (a loader's restore keys name the loader's wrapper in the reference: loader.restore_sample takes them)
# (worker_has_samples asks the reference's worker context: in the main process only without workers)
out["has_samples"] = get_val_dataset(data["a"], split_part="val", batch_size=None, worker_config=wc()).worker_has_samples()
return out
"""
)

program("dataset_functions_default_task_encoder")(
    """
import inspect
defaults = {
    fn.__name__: inspect.signature(fn).parameters["task_encoder"].default
    for fn in (get_train_dataset, get_val_dataset, get_val_datasets)
}
shared = defaults["get_val_dataset"]
ds = get_val_dataset(data["b"], split_part="train", batch_size=5, worker_config=wc(), task_encoder=shared)
return {
    "types": {name: type(d).__name__ for name, d in defaults.items()},
    "passed_explicitly": [keys(b) for b in get_loader(ds)],
}
"""
)

program("error_classes_as_constructed_by_user_code")(
    """
from megatron.energon.flavors.webdataset.indexing import DuplicateSampleKeyError
duplicate = DuplicateSampleKeyError("s00_001")
skip = SkipSample("too short")
refused = []
try:
    SkipSample(reason="x")
except TypeError:
    refused.append("keywords")
return {
    "duplicate": [duplicate.sample_key, isinstance(duplicate, Exception), "s00_001" in str(duplicate)],
    "skip": [list(skip.args), str(skip), isinstance(skip, Exception)],
    "refused": refused,
}
"""
)
