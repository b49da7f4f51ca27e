"""The model: per-layer tables, the kernels each layer runs, and how each parallel dimension shards them."""
