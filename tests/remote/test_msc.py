"""``msc://profile/path`` datasets through the real multi-storage-client.

An MSC config (``MSC_CONFIG``) names two profiles: ``objs``, an S3 profile whose endpoint is the
moto server on loopback and whose base path is a bucket, and ``disk``, a POSIX profile over a
temporary folder. Datasets are prepared with ``energon prepare msc://...``, inspected with
``energon info``, and loaded through ``msc://`` exactly as users do; they must give the samples of
the same dataset loaded from a local folder.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from energon import (
    Cooker,
    DefaultTaskEncoder,
    TextSample,
    WorkerConfig,
    basic_sample_keys,
    cooker,
    epath,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from energon.cli.info import command as info_command
from energon.cli.prepare import command as prepare_command
from energon.demo import write_text_shards
from energon.remote import RemoteError, RemoteNotFoundError, remote_stats
from tests.helpers.datasets import make_text_dataset

pytest.importorskip("moto.server")
pytest.importorskip("multistorageclient")
boto3 = pytest.importorskip("boto3")

from energon.remote import msc  # noqa: E402  (after the importorskip)
from tests.helpers.s3_fault_proxy import start_fault_proxy  # noqa: E402

BUCKET = "energon-msc"
ACCESS_KEY = "msc-test-access-key-id"
SECRET = "msc-secret-key-never-to-be-shown-4f9a"
PREPARE_ARGS = [
    "--non-interactive",
    "--split-ratio",
    "2,1,1",
    "--no-progress",
    "--sample-type",
    "TextSample",
    "--field-map",
    '{"text": "txt"}',
]
META_YAML = (
    "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
)


def _profiles(endpoint: str, disk: Path, **extra: dict) -> dict:
    s3_profile = {
        "storage_provider": {
            "type": "s3",
            "options": {"base_path": BUCKET, "endpoint_url": endpoint, "region_name": "us-east-1"},
        },
        "credentials_provider": {
            "type": "S3Credentials",
            "options": {"access_key": ACCESS_KEY, "secret_key": SECRET},
        },
    }
    disk_profile = {"storage_provider": {"type": "file", "options": {"base_path": str(disk)}}}
    return {"profiles": {"objs": s3_profile, "disk": disk_profile, **extra}}


def _s3_put_tree(local_root: Path, bucket: str, prefix: str, endpoint: str) -> None:
    client = boto3.client("s3", endpoint_url=endpoint)
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    for path in sorted(p for p in local_root.rglob("*") if p.is_file()):
        key = f"{prefix}/{path.relative_to(local_root).as_posix()}"
        client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())


class _Stores:
    """Where the module's data lives: the MSC config, the disk profile's folder, local datasets."""

    def __init__(self, root: Path, endpoint: str) -> None:
        self.root = root
        self.endpoint = endpoint
        self.disk = root / "disk"
        self.disk.mkdir()
        self.config = root / "msc_config.json"
        self.config.write_text(json.dumps(_profiles(endpoint, self.disk)))

    def put(self, local_root: Path, url: str) -> None:
        """Copy a local folder to ``msc://objs/...``, ``msc://disk/...`` or ``s3://...``."""
        if url.startswith("msc://disk/"):
            shutil.copytree(local_root, self.disk / url[len("msc://disk/") :])
        elif url.startswith("msc://objs/"):
            _s3_put_tree(local_root, BUCKET, url[len("msc://objs/") :], self.endpoint)
        else:
            bucket, _, prefix = url[len("s3://") :].partition("/")
            _s3_put_tree(local_root, bucket, prefix, self.endpoint)

    def get(self, url: str) -> bytes:
        """An object's bytes, read without msc."""
        if url.startswith("msc://disk/"):
            return (self.disk / url[len("msc://disk/") :]).read_bytes()
        key = url[len("msc://objs/") :]
        return boto3.client("s3").get_object(Bucket=BUCKET, Key=key)["Body"].read()

    def keys(self, url: str) -> list[str]:
        """Paths of all objects under ``url``, relative to it, read without msc."""
        if url.startswith("msc://disk/"):
            base = self.disk / url[len("msc://disk/") :]
            return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())
        prefix = url[len("msc://objs/") :] + "/"
        page = boto3.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=prefix)
        return sorted(item["Key"][len(prefix) :] for item in page.get("Contents", []))


@pytest.fixture(scope="module")
def stores(tmp_path_factory, moto_endpoint) -> _Stores:
    """Datasets under both profiles and plain s3://, plus metadataset YAMLs (one stored remotely)."""
    st = _Stores(tmp_path_factory.mktemp("msc"), moto_endpoint)
    st.text = make_text_dataset(st.root / "text", num_samples=60, num_shards=3)
    st.other = make_text_dataset(st.root / "other", num_samples=30, num_shards=2, seed=1)
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            mp.setenv(name, "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        st.put(st.text, "msc://objs/text")
        st.put(st.text, "msc://disk/text")
        st.put(st.other, f"s3://{BUCKET}-plain/other")
        # a metadataset YAML stored under msc:// next to its dataset, with a relative path
        meta = st.root / "meta"
        meta.mkdir()
        (meta / "meta.yaml").write_text(META_YAML + "      - weight: 1\n        path: ./ds\n")
        st.put(st.text, "msc://objs/mds/ds")
        st.put(meta, "msc://objs/mds")
        # a metadataset mixing an s3:// leaf and an msc:// leaf (stored on the disk profile),
        # and the same blend over the local copies
        blend = "      - weight: 1\n        path: {}\n      - weight: 2\n        path: {}\n"
        mixed = st.root / "mixed"
        mixed.mkdir()
        (mixed / "mixed.yaml").write_text(
            META_YAML + blend.format(f"s3://{BUCKET}-plain/other", "msc://objs/text")
        )
        st.put(mixed, "msc://disk/mixed")
        st.local_mixed = st.root / "local_mixed.yaml"
        st.local_mixed.write_text(META_YAML + blend.format(st.other, st.text))
    return st


@pytest.fixture
def msc_env(fake_aws_env, monkeypatch, stores) -> _Stores:
    """``MSC_CONFIG`` pointing at the module's config; fresh msc clients, cache and counters."""
    monkeypatch.setenv("MSC_CONFIG", str(stores.config))
    msc.reset_client()
    remote_stats().reset()
    yield stores
    msc.reset_client()


def _loader(path, num_workers: int):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    ds = get_train_dataset(
        path, worker_config=wc, batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=4
    )
    return get_savable_loader(ds)


def _take(loader, n: int) -> list:
    it = iter(loader)
    return [next(it) for _ in range(n)]


def _texts(batches) -> list:
    return [(tuple(b.__key__), tuple(b.text)) for b in batches]


# ---------------------------------------------------------------------------------------------
# prepare and info through the CLI


@pytest.mark.parametrize("profile,num_workers", [("objs", 2), ("disk", 1)])
def test_cli_prepare_and_info(msc_env, tmp_path, profile, num_workers):
    raw = tmp_path / "raw"
    shards = write_text_shards(raw, num_samples=40, num_shards=4, min_chars=5, max_chars=40)
    local = tmp_path / "local"
    shutil.copytree(raw, local)
    runner = CliRunner()
    result = runner.invoke(prepare_command, [str(local), *PREPARE_ARGS])
    assert result.exit_code == 0, result.output

    url = f"msc://{profile}/prep{num_workers}"
    msc_env.put(raw, url)
    args = [url, *PREPARE_ARGS, "--num-workers", str(num_workers)]
    result = runner.invoke(prepare_command, [*args, "--tmp-path", str(tmp_path / "stage")])
    assert result.exit_code == 0, result.output
    keys = msc_env.keys(url)
    assert not [k for k in keys if k.endswith(".tmp")], keys
    meta = local / ".nv-meta"
    assert json.loads(msc_env.get(f"{url}/.nv-meta/.info.json")) == json.loads(
        (meta / ".info.json").read_text()
    )
    for name in ("split.yaml", "dataset.yaml"):
        assert msc_env.get(f"{url}/.nv-meta/{name}") == (meta / name).read_bytes()
    for shard in shards:
        assert msc_env.get(f"{url}/{shard}.idx") == (local / f"{shard}.idx").read_bytes()

    info = runner.invoke(info_command, [url])
    assert info.exit_code == 0, info.output
    assert "Total samples: 40 samples" in info.output
    assert "Shards: 4 shards" in info.output
    assert "TextSample" in info.output

    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    for split in ("train", "val", "test"):
        want = get_val_dataset(local, split_part=split, worker_config=wc, batch_size=None)
        got = get_val_dataset(url, split_part=split, worker_config=wc, batch_size=None)
        assert [(s.__key__, s.text) for s in get_loader(got)] == [
            (s.__key__, s.text) for s in get_loader(want)
        ]


# ---------------------------------------------------------------------------------------------
# loading


@pytest.mark.parametrize("url,num_workers", [("msc://objs/text", 0), ("msc://objs/text", 2)])
def test_loader_equals_local(msc_env, url, num_workers):
    local = _texts(_take(_loader(msc_env.text, num_workers), 12))
    assert _texts(_take(_loader(url, num_workers), 12)) == local
    if num_workers == 0:
        stats = remote_stats()
        assert stats.bytes_read > 0 and stats.requests > 0 and stats.retries == 0


def test_posix_profile_and_file_url_equal_local(msc_env):
    local = _texts(_take(_loader(msc_env.text, 0), 8))
    assert _texts(_take(_loader("msc://disk/text", 0), 8)) == local
    assert _texts(_take(_loader(f"file://{msc_env.text}", 0), 8)) == local


def test_save_restore_state_has_no_credentials(msc_env):
    url = "msc://objs/text"
    loader = _loader(url, 2)
    it = iter(loader)
    [next(it) for _ in range(4)]
    state = loader.save_state_rank()
    expected = _texts([next(it) for _ in range(6)])
    restored = _loader(url, 2)
    restored.restore_state_rank(state)
    assert _texts(_take(restored, 6)) == expected
    saved = json.dumps(state)
    assert url in saved
    assert SECRET not in saved and ACCESS_KEY not in saved


def test_remote_metadataset_resolves_relative_paths_under_msc(msc_env):
    local = _texts(_take(_loader(msc_env.text, 0), 8))
    assert _texts(_take(_loader("msc://objs/mds/meta.yaml", 0), 8)) == local


def test_metadataset_mixing_s3_and_msc_leaves(msc_env):
    local = _texts(_take(_loader(msc_env.local_mixed, 0), 12))
    remote = _texts(_take(_loader("msc://disk/mixed/mixed.yaml", 0), 12))
    assert remote == local
    keys = {k for batch_keys, _ in remote for k in batch_keys}
    other_keys = {s.__key__ for s in get_loader(_val(msc_env.other))}
    assert keys & other_keys and keys - other_keys  # both leaves contribute


def _val(path):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    return get_val_dataset(path, split_part="train", worker_config=wc, batch_size=None)


@cooker
def _cook_with_remote_aux(sample, notes, twin):
    key = sample["__key__"]
    own = sample["txt"]  # decoded by the default decoder
    return TextSample(
        **basic_sample_keys(sample),
        text="|".join([own, notes.get(f"{key}.txt", sample), twin.get(f"{key}.txt", sample)]),
    )


class _RemoteAuxEncoder(DefaultTaskEncoder):
    cookers = [Cooker(_cook_with_remote_aux, has_subflavors={"kind": "crude"})]


@pytest.mark.parametrize("notes_url", ["msc://objs/notes", "msc://disk/notes"])
def test_aux_folders_and_datasets_under_msc(msc_env, tmp_path, notes_url):
    """``aux`` in Megatron-Energon's remote forms: ``filesystem+msc://profile/folder`` (a folder of
    files) and ``msc://profile/dataset`` (a prepared dataset read by ``<key>.<part>``)."""
    crude = make_text_dataset(tmp_path / "crude", num_samples=60, num_shards=3)  # msc_env.text's
    (crude / ".nv-meta" / "dataset.yaml").write_text(
        "__module__: megatron.energon\n__class__: CrudeWebdataset\nsubflavors: {kind: crude}\n"
    )
    keys = [s["__key__"] for s in get_loader(_val(crude))]
    notes = tmp_path / "notes"
    notes.mkdir()
    for key in keys:
        (notes / f"{key}.txt").write_text(f"note of {key}")
    msc_env.put(notes, notes_url)
    mds = tmp_path / "aux.yaml"
    mds.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n"
        f"    path: ./crude\n    aux:\n      notes: filesystem+{notes_url}\n"
        "      twin: msc://objs/text\n"
    )
    wc = WorkerConfig(rank=0, world_size=1, num_workers=1)
    ds = get_val_dataset(
        mds, split_part="train", worker_config=wc, batch_size=None, task_encoder=_RemoteAuxEncoder()
    )
    got = {s.__key__: s.text.split("|") for s in get_loader(ds)}
    assert sorted(got) == sorted(keys)
    for key, (own, note, twin) in got.items():
        assert note == f"note of {key}" and twin == own


# ---------------------------------------------------------------------------------------------
# errors, retries, credentials


def test_missing_objects_fail_fast_naming_the_msc_url(msc_env):
    """Fast means without retries (and their backoff): counted, not timed."""
    remote_stats().reset()
    with pytest.raises(FileNotFoundError, match="msc://objs/nope"):
        _loader("msc://objs/nope", 0)
    for url in ("msc://objs/text/missing.tar", "msc://disk/text/missing.tar"):
        with pytest.raises(RemoteNotFoundError, match=url) as err:
            msc.read_range(url, 0, 10)
        assert SECRET not in str(err.value) and ACCESS_KEY not in str(err.value)
        with pytest.raises(RemoteNotFoundError, match=url):
            msc.head(url)
        assert not epath.is_file(url)
    assert not epath.exists("msc://objs/nope") and epath.is_dir("msc://objs/text")
    with pytest.raises(RemoteError, match="msc://nosuchprofile"):
        epath.read_bytes("msc://nosuchprofile/x")
    assert remote_stats().retries == 0


def test_write_list_delete_round_trip(msc_env):
    for profile in ("objs", "disk"):
        base = f"msc://{profile}/rw"
        epath.write_bytes(f"{base}/a/one.bin", b"1" * 10)
        epath.write_bytes(f"{base}/a/two.bin", b"22")
        epath.write_bytes(f"{base}/ab.bin", b"3")
        assert list(epath.walk(f"{base}/a")) == [f"{base}/a/one.bin", f"{base}/a/two.bin"]
        assert list(msc.list_keys(f"{base}/a")) == [
            f"{base}/a/one.bin",
            f"{base}/a/two.bin",
            f"{base}/ab.bin",
        ]
        assert epath.read_range(f"{base}/a/one.bin", 3, 7) == b"1111"
        assert epath.stat(f"{base}/a/two.bin")[0] == 2
        msc.delete(f"{base}/a/two.bin")
        msc.delete(f"{base}/a/two.bin")  # already gone: not an error
        assert list(epath.walk(f"{base}/a")) == [f"{base}/a/one.bin"]
    assert remote_stats().bytes_written == 2 * 13


def test_msc_retries_are_ours_and_counted(msc_env, monkeypatch, tmp_path):
    """Two 503s on ranged reads: two retries counted (msc's and botocore's retries are off)."""
    proxy, handler, stop = start_fault_proxy(
        msc_env.endpoint, schedule=lambda n: "slowdown" if n <= 2 else None
    )
    try:
        config = _profiles(msc_env.endpoint, msc_env.disk)
        config["profiles"]["flaky"] = _profiles(proxy, msc_env.disk)["profiles"]["objs"]
        path = tmp_path / "msc_flaky.yaml"
        path.write_text(json.dumps(config))  # YAML is a superset of JSON
        monkeypatch.setenv("MSC_CONFIG", str(path))
        msc.reset_client()
        remote_stats().reset()
        data = msc.read_range("msc://flaky/text/.nv-meta/.info.json", 0, 5)
        assert data == msc_env.get("msc://objs/text/.nv-meta/.info.json")[:5]
        assert remote_stats().retries == 2
        assert remote_stats().requests == 3
        assert remote_stats().throttled == 2 == handler.faults["slowdown"]
    finally:
        stop()


def test_credentials_never_in_messages(msc_env, monkeypatch, tmp_path):
    # an endpoint that carries credentials in its URL and cannot be reached
    config = _profiles(msc_env.endpoint, msc_env.disk)
    leaky = config["profiles"]["objs"]
    leaky = json.loads(json.dumps(leaky))
    leaky["storage_provider"]["options"]["endpoint_url"] = f"http://user:{SECRET}@127.0.0.1:9"
    config["profiles"]["leaky"] = leaky
    path = tmp_path / "msc_leaky.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("MSC_CONFIG", str(path))
    monkeypatch.setenv("ENERGON_REMOTE_MAX_ATTEMPTS", "2")
    msc.reset_client()
    with pytest.raises(RemoteError) as err:
        msc.read_range("msc://leaky/text/x.tar", 0, 10)
    assert "msc://leaky/text/x.tar" in str(err.value)
    assert SECRET not in str(err.value)
    # anything msc says is scrubbed of the profile's credentials before we repeat it
    msc.client("objs")
    assert msc.redact(f"key {ACCESS_KEY} secret {SECRET}") == "key *** secret ***"


def test_error_classification():
    from botocore.exceptions import ClientError, ConnectTimeoutError
    from multistorageclient.types import RetryableError

    def client_error(status: int, code: str) -> ClientError:
        response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
        return ClientError(response, "GetObject")

    assert msc.classify(client_error(404, "NoSuchKey")) == "missing"
    assert msc.classify(client_error(403, "AccessDenied")) == "permanent"
    assert msc.classify(client_error(503, "SlowDown")) == "transient"
    assert msc.classify(PermissionError("denied")) == "permanent"
    assert msc.classify(FileNotFoundError("gone")) == "missing"
    assert msc.classify(RetryableError("again")) == "transient"
    wrapped = RuntimeError("Failed to GET")
    wrapped.__cause__ = ConnectTimeoutError(endpoint_url="http://x")
    assert msc.classify(wrapped) == "transient"
    assert msc.classify(RuntimeError("Failed to GET")) == "permanent"
    assert msc.classify(ValueError("bad")) == "permanent"


def test_without_msc_installed_the_message_says_what_to_install(msc_env, monkeypatch):
    monkeypatch.setitem(sys.modules, "multistorageclient", None)
    msc.reset_client()
    with pytest.raises(ImportError, match=r"pip install 'energon-loader\[msc\]'"):
        epath.read_bytes("msc://objs/text/.nv-meta/.info.json")
    with pytest.raises(ImportError, match=r"pip install 'energon-loader\[msc\]'"):
        epath.read_range("msc://objs/text/.nv-meta/.info.json", 0, 4)
