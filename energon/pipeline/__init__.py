"""Per-stream stages with explicit, plain-data state (a tiny node protocol).

Every stage is an iterator of ``(value, restore_key)`` items with three more methods:
``state()`` (plain data), ``restore(state)`` and ``rebuild(restore_key)`` (regenerate one item from its
key, used to refill buffers after a restore and by ``loader.restore_sample``).
"""
