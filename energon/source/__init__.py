"""Leaf datasets: turn a sample index into a loaded sample."""
