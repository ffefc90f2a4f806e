"""Partition replicas: key and row encodings, the per-partition RocksDB store."""
