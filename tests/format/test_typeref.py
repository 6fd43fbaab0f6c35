"""Hostile configs: YAML names classes and functions only through one allow-list, and aux file
stores never read outside their folder."""

from __future__ import annotations

import os
import sys
import types

import pytest

from energon import TextSample, WorkerConfig, get_val_dataset
from energon.errors import SampleException
from energon.format.typeref import resolve_class
from energon.source.file_store import SystemFileStore, open_file_store
from tests.helpers.datasets import make_text_dataset


def user_joiner(primary, secondary):
    return primary


@pytest.mark.parametrize(
    "module,name",
    [
        ("os", "system"),
        ("subprocess", "Popen"),
        ("builtins", "exec"),
        ("builtins", "eval"),
        ("pickle", "loads"),
        ("importlib", "import_module"),
        ("energon", "import_module"),  # a name bound in energon/__init__.py, not public API
        ("megatron.energon", "version"),
        ("torch", "load"),  # an installed package, already imported
    ],
)
@pytest.mark.parametrize("function", [False, True])
def test_stdlib_builtins_and_installed_packages_are_refused(module, name, function):
    import torch  # noqa: F401 - make sure it is imported: being imported is not enough

    with pytest.raises(ValueError, match="Refusing|no public|not a class|not a Python function"):
        resolve_class(module, name, where="x.yaml", function=function)


def test_user_code_and_energon_api_are_allowed():
    assert resolve_class("energon", "TextSample") is TextSample
    assert resolve_class("megatron.energon", "TextSample") is TextSample
    assert resolve_class(__name__, "user_joiner", function=True) is user_joiner
    with pytest.raises(ValueError, match="not a class"):
        resolve_class(__name__, "user_joiner")


def test_user_module_reexporting_a_dangerous_function_is_refused(tmp_path, monkeypatch):
    mod = types.ModuleType("reexporting_user_module")
    mod.__file__ = str(tmp_path / "reexporting_user_module.py")
    mod.system = os.system
    mod.popen = __import__("subprocess").Popen
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    with pytest.raises(
        ValueError, match="defined in 'posix'|defined in 'nt'|not a Python function"
    ):
        resolve_class(mod.__name__, "system", function=True)
    with pytest.raises(ValueError, match="defined in 'subprocess'"):
        resolve_class(mod.__name__, "popen", function=True)


def test_env_allow_list_opts_an_installed_module_in(monkeypatch):
    with pytest.raises(ValueError, match="ENERGON_ALLOWED_MODULES=json.decoder"):
        resolve_class("json.decoder", "JSONDecoder")
    monkeypatch.setenv("ENERGON_ALLOWED_MODULES", "json")
    from json.decoder import JSONDecoder

    assert resolve_class("json.decoder", "JSONDecoder") is JSONDecoder


@pytest.fixture(scope="module")
def join_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile_join")
    make_text_dataset(root / "a", num_samples=12, num_shards=2)
    make_text_dataset(root / "b", num_samples=12, num_shards=2, seed=3)
    return root


@pytest.mark.parametrize(
    "joiner",
    [
        "{__module__: os, __function__: system}",
        "{__module__: subprocess, __class__: Popen}",
        "{__module__: builtins, __function__: exec}",
        "{__module__: energon, __class__: import_module}",
    ],
)
def test_metadataset_joiner_cannot_name_dangerous_callables(join_root, joiner):
    mds = join_root / "evil.yaml"
    mds.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    join:\n"
        f"      - path: ./a\n      - path: ./b\n    joiner: {joiner}\n"
    )
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    with pytest.raises(ValueError, match="Refusing|no public|not a class"):
        get_val_dataset(mds, split_part="train", worker_config=wc, batch_size=None)


def test_joiner_class_must_be_a_sample_class(join_root):
    mds = join_root / "not_sample.yaml"
    mds.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    join:\n"
        "      - path: ./a\n      - path: ./b\n"
        "    joiner: {__module__: energon, __class__: WorkerConfig}\n"
    )
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    with pytest.raises(ValueError, match="from_joined"):
        get_val_dataset(mds, split_part="train", worker_config=wc, batch_size=None)


def test_aux_folder_store_stays_inside_its_root(tmp_path):
    root = tmp_path / "aux"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "ok.txt").write_bytes(b"inside")
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"outside")
    (root / "link_out.txt").symlink_to(secret)
    (root / "dir_out").symlink_to(tmp_path)
    (root / "link_in.txt").symlink_to(root / "sub" / "ok.txt")
    store = open_file_store(f"filesystem://{root}")
    assert store["sub/ok.txt"][0] == b"inside"
    assert store["link_in.txt"][0] == b"inside"
    for name in [
        "../secret.txt",
        "sub/../../secret.txt",
        str(secret),
        "link_out.txt",
        "dir_out/secret.txt",
        "sub/\0x",
    ]:
        with pytest.raises(SampleException, match="outside|not a valid"):
            store[name]
    with pytest.raises(ValueError, match="names no folder"):
        open_file_store("filesystem://")


def test_remote_folder_store_refuses_escapes():
    store = SystemFileStore("s3://bucket/aux")
    for name in ["../x", "a/../../x", "s3://bucket/other/x", "/etc/passwd"]:
        with pytest.raises(SampleException, match="outside"):
            store._path(name)
    assert store._path("a/b.txt") == "s3://bucket/aux/a/b.txt"
