"""The global sample plan: deterministic pointer arithmetic, no I/O.

Everything here is a pure function of sample counts, the seed and small cursors whose state is a
few integers: how a leaf's index space is split among logical streams and cut into slices
(``sharding``), the order in which one stream hands out the sample indices of one leaf
(``reader.SliceReader``), which source a blending stream reads next (``mixing.Schedule``; with
weights that change over the global sample clock: ``schedules``) and the
counter-based random numbers all of them draw from (``rng``). Nothing in ``plan/`` opens a file,
reads a sample or touches a global RNG; a reader only *tells* an optional observer which index ranges
come next, and the pipeline decides what to prefetch. So the plan can be run on pointers alone
(``energon.pipeline.pointers.build_pointer_stages``), e.g. to say which samples a step saw.
"""
