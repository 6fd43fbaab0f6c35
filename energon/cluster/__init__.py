"""Other machines: connecting to a Ray cluster (:mod:`energon.cluster.ray_cluster`) and running work
there in order (shard scans of ``energon prepare --ray``). Ray is optional (``energon-loader[ray]``):
nothing here imports it until a caller asks for a cluster."""
