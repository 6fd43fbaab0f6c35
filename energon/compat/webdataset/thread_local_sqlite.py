"""``megatron.energon.flavors.webdataset.thread_local_sqlite``: one read-only SQLite connection
per thread (and per process: a forked child opens its own), as energon's index readers do."""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Any

__all__ = ["ThreadLocalSqlite", "ThreadLocalStorage", "main"]


class ThreadLocalStorage:
    """Attributes named in ``__thread_local__`` are per thread; ``__thread_init__`` sets them up
    the first time a thread touches one."""

    __thread_local__: tuple[str, ...] = ()

    def __init__(self) -> None:
        object.__setattr__(self, "_tls", threading.local())

    def _local(self) -> threading.local:
        local = object.__getattribute__(self, "_tls")
        if getattr(local, "pid", None) != os.getpid():
            local.__dict__.clear()
            local.pid = os.getpid()
            init = getattr(type(self), "__thread_init__", None)
            if init is not None:
                init(self)
        return local

    def __getattr__(self, name: str) -> Any:
        if name in type(self).__thread_local__:
            try:
                return getattr(self._local(), name)
            except AttributeError:
                raise AttributeError(name) from None
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in type(self).__thread_local__:
            setattr(self._local(), name, value)
        else:
            object.__setattr__(self, name, value)

    def thread_close(self) -> None:
        """Forget this thread's values."""
        object.__getattribute__(self, "_tls").__dict__.clear()


class ThreadLocalSqlite(ThreadLocalStorage):
    """``select_one`` / ``select_all`` on ``database`` over this thread's own connection."""

    __thread_local__ = ("connection",)

    def __init__(self, database: str, is_uri: bool = False) -> None:
        super().__init__()
        self.database = database
        self.is_uri = is_uri

    def __thread_init__(self) -> None:
        self.connection = sqlite3.connect(self.database, uri=self.is_uri, check_same_thread=False)

    def select_one(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        return self.connection.execute(query, params).fetchone()

    def select_all(self, query: str, params: tuple[Any, ...] = ()) -> list[Any]:
        return self.connection.execute(query, params).fetchall()

    def thread_close(self) -> None:
        connection = getattr(object.__getattribute__(self, "_tls"), "connection", None)
        if connection is not None:
            connection.close()
        super().thread_close()


def main() -> None:
    """A small self-check: each thread reads through its own connection."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.sqlite")
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE t (x INTEGER)")
            db.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(10)])
        reader = ThreadLocalSqlite(path)
        results: list[Any] = []
        threads = [
            threading.Thread(
                target=lambda: results.append(reader.select_one("SELECT SUM(x) FROM t"))
            )
            for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print(results)
