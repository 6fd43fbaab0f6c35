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

def listing(root):
    root = Path(root)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
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
