"""Tensor parallelism over the GPUs of one host: the split of a model over ranks (shard.py), its
NumPy reference with the all-reduce as a sum in rank order (reference.py), and the device loop
driven over several devices (devices.py)."""
