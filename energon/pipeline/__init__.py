"""Per-stream stages with explicit, plain-data state.

The contract every stage keeps is :class:`~energon.pipeline.stage.Stage` (``next``, ``state``,
``restore``, ``rebuild``); restore keys have their shapes in ``keys``, a stream's snapshot its layout
in ``snapshot``. ``pointers`` builds the pointer part of a stream (what comes next, no data read),
``stages`` the stages that read and transform samples, ``assembly`` the one list of the steps a
sample goes through between loading and batching, ``stream`` one logical stream's chain,
``executor`` a worker's share of the global micro-batch positions.
"""
