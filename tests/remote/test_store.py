"""The remote-store contract: every scheme module implements it, and URLs split the same way."""

from __future__ import annotations

import pytest

from energon import epath
from energon.remote import msc, s3
from energon.remote.store import RemoteStore, split_url


@pytest.mark.parametrize("store", [s3, msc])
def test_each_scheme_module_is_a_remote_store(store):
    assert isinstance(store, RemoteStore)


def test_epath_picks_the_store_by_scheme():
    assert epath._store("s3://bucket/key") is s3
    assert epath._store("msc://profile/key") is msc


def test_something_without_the_operations_is_not_a_store():
    class ReadOnly:
        def head(self, url):
            return 0, ""

    assert not isinstance(ReadOnly(), RemoteStore)


def test_split_url():
    assert split_url("s3://bucket/a/b") == ("bucket", "a/b")
    assert split_url("msc://profile/a") == ("profile", "a")
    with pytest.raises(ValueError, match="needs a bucket"):
        split_url("s3:///key")
    with pytest.raises(ValueError, match="needs a profile"):
        split_url("msc:///key")
