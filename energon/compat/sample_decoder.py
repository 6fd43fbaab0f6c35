"""``megatron.energon.flavors.webdataset.sample_decoder``: decoding a sample's parts by extension
(energon's ``SampleDecoder``, :mod:`energon.decode`)."""

from __future__ import annotations

from energon.compat.av import AVWebdatasetDecoder
from energon.compat.cache import FileStoreDecoder
from energon.decode import SampleDecoder

__all__ = ["AVWebdatasetDecoder", "FileStoreDecoder", "SampleDecoder"]
