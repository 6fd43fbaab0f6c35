"""Seeing what a loader does while it runs (``probe`` in the workers, ``stats`` in the main
process) and when it stalls (``watchdog``). The tools that run before training (``simulate``,
``measure``, ``report``) are in ``energon.preflight``. See docs/observability.md."""
