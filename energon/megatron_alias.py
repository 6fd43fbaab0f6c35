"""Opt-in: make ``import megatron.energon`` (and its submodules) use this package. One line, before
anything imports Megatron-Energon:

    import energon.megatron_alias  # noqa: F401

Code written for the reference then runs unchanged: ``from megatron.energon import X`` and
``import megatron.energon.<module path>`` give energon's objects. Each reference module path maps to
exactly one energon module (``energon.compat.modules.REFERENCE_MODULES``), imported on first use, so
``megatron.energon.wrappers is energon.compat.wrappers`` and ``isinstance`` works across both names.
A real megatron-energon install is never shadowed: if one is importable, this refuses with an error
saying so.
"""

from energon.compat.alias import install, reference_submodule

__all__ = ["install", "reference_submodule"]

install()
