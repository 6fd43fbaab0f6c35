"""Seeing what a loader does: before training (``simulate``, ``measure``, ``report``), while it
runs (``probe`` in the workers, ``stats`` in the main process) and when it stalls (``watchdog``).
See docs/observability.md."""
