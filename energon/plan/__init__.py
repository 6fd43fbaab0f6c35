"""The global sample plan: pure arithmetic over sample counts (no I/O, no global RNG)."""
