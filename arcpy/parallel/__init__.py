"""Tensor parallelism over the GPUs of one host: the split of a model over ranks (shard.py), its
NumPy reference with the all-reduce as a sum in rank order (reference.py), a rank's NCCL
communicator (comm.py), the ranks opened on their GPUs (cuda.py), and the device loop driven over
several devices (devices.py)."""
