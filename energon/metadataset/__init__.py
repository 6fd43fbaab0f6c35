"""Metadatasets: YAML (or Python) descriptions of blends, epochized blends and joins of datasets."""
