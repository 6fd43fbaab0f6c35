"""``megatron.energon.eyaml``: reading YAML (and JSON) files, as the reference's loaders do."""

from __future__ import annotations

import json
from typing import Any, BinaryIO

import yaml

from energon.compat.epathlib import EPath

__all__ = ["EPath", "load_yaml", "load_yaml_json"]


def load_yaml(stream: BinaryIO | bytes) -> Any:
    """The YAML document in ``stream`` (a binary file object or bytes) as Python objects."""
    data = stream if isinstance(stream, (bytes, bytearray)) else stream.read()
    return yaml.safe_load(data)


def load_yaml_json(path: EPath) -> Any:
    """A ``.json`` file as JSON, anything else as YAML."""
    path = EPath(path)
    data = path.read_bytes()
    return json.loads(data) if path.name.endswith(".json") else load_yaml(data)
