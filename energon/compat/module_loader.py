"""``megatron.energon.module_loader``: functions from Python files named in configs
(``"sample_loader.py:sample_loader"``), each file loaded once per loader."""

from __future__ import annotations

import os
import types
from collections.abc import Callable
from typing import Any

from energon import epath
from energon.compat.epathlib import EPath
from energon.source.sample_loader import load_script_module

__all__ = ["EPath", "ModuleLoader"]


class ModuleLoader:
    """Loads Python files as modules (cached by path) and gives functions from them."""

    def __init__(self) -> None:
        self.modules: dict[str, types.ModuleType] = {}

    def _module(self, path: str) -> types.ModuleType:
        if path not in self.modules:
            self.modules[path] = load_script_module(path)
        return self.modules[path]

    def get_function(
        self,
        module_fn: str | EPath,
        default_fn_name: str | None = None,
        relative_path: EPath | None = None,
    ) -> Callable[..., Any]:
        """The function ``"path/to/module.py:function"`` (``default_fn_name`` when the name is
        left out; a relative path is relative to ``relative_path``)."""
        text = os.fspath(module_fn)
        file, _, name = text.rpartition(":") if ":" in text.split("/")[-1] else (text, "", "")
        name = name or default_fn_name
        if not name:
            raise ValueError(f"Function name must be specified ({text!r} names none)")
        if relative_path is not None and not epath.is_absolute(file):
            file = epath.join(os.fspath(relative_path), file)
        return getattr(self._module(epath.normalize(file)), name)
