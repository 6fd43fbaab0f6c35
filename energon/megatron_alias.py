"""Opt-in: make ``import megatron.energon`` use this package (one line, before Megatron imports it).

    import energon.megatron_alias  # noqa: F401

Megatron-LM's multimodal data provider, task encoders and V1 metadatasets then run on energon
unchanged. A real megatron-energon install is never shadowed: if one is importable, this refuses with
an error saying so.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

from energon.errors import MegatronEnergonInstalledError

# Module paths Megatron-LM imports from, mapped onto ours.
_SUBMODULES = {
    "megatron.energon": "energon",
    "megatron.energon.task_encoder": "energon.task_encoder",
    "megatron.energon.task_encoder.base": "energon.task_encoder",
    "megatron.energon.errors": "energon.errors",
    "megatron.energon.av": "energon.av",
    "megatron.energon.media": "energon.media",
    "megatron.energon.epathlib": "energon.epath",
}


def _real_megatron_energon() -> str | None:
    if isinstance(sys.modules.get("megatron.energon"), types.ModuleType) and getattr(
        sys.modules["megatron.energon"], "__energon_alias__", False
    ):
        return None
    try:
        spec = importlib.util.find_spec("megatron.energon")
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def install() -> None:
    """Register the aliases (idempotent)."""
    origin = _real_megatron_energon()
    if origin is not None:
        raise MegatronEnergonInstalledError(
            f"megatron-energon is installed ({origin}); energon will not shadow it. Uninstall it "
            "(pip uninstall megatron-energon) or import energon directly."
        )
    try:
        parent = importlib.import_module("megatron")
    except ImportError:
        parent = types.ModuleType("megatron")
        parent.__path__ = []  # a namespace for the alias only
        sys.modules["megatron"] = parent
    for alias, target in _SUBMODULES.items():
        module = importlib.import_module(target)
        sys.modules[alias] = module
    energon = importlib.import_module("energon")
    energon.__energon_alias__ = True
    parent.energon = energon


install()
