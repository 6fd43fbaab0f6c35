"""``megatron.energon.flavors.webdataset.sample_decoder``: decoding a sample's parts by extension
(energon's ``SampleDecoder``, :mod:`energon.decode`), and the reference's content-guessing wrapper
for webdataset-style handlers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from energon.compat.av import AVWebdatasetDecoder
from energon.compat.cache import FileStoreDecoder
from energon.decode import SampleDecoder
from energon.decode.sniff import guess_extension

__all__ = ["AVWebdatasetDecoder", "FileStoreDecoder", "GuessingHandlerWrapper", "SampleDecoder"]

Handler = Callable[[str, bytes], Any]


class GuessingHandlerWrapper:
    """Calls a handler ``(key, data)`` with the extension its magic bytes name instead of the
    key (the key as given when the content is not recognised), so a handler that decodes by
    extension also decodes parts named ``.bin`` or without an extension."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    def __call__(self, key: str, data: bytes) -> Any:
        return self.handler(guess_extension(data) or key, data)

    @staticmethod
    def wrap(active: bool, handlers: list[Handler]) -> list[Handler]:
        """``handlers``, each wrapped when ``active``."""
        return [GuessingHandlerWrapper(h) for h in handlers] if active else handlers
