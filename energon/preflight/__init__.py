"""Tools that run before training, over the real pipeline and the plan: ``simulate`` (what a
configuration will read, without decoding), ``measure`` (how fast its stages are) and ``report``
(both in one HTML page). They sit above the loader and the ledger they drive; what runs inside a
training loader (the probe, the stats board, the watchdog) stays in ``energon.observe``.
See docs/observability.md."""
