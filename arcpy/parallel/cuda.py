"""A model split over GPUs (tensor parallelism), one process driving every rank: each GPU gets
a context, its rank's communicator (arcpy.parallel.comm: NCCL), its shard of the weights
(arcpy.parallel.shard) and a CudaDevice whose step graphs hold the all-reduces; the ranks
together are one TensorParallelDevice. A world of one runs the same code through NCCL on one GPU.

What a rank does not do yet: its prefill (the prompt goes through the decode step, token by token,
on every rank), speculative steps, and the device features the ranks would have to combine
(TensorParallelDevice says which)."""

from __future__ import annotations

from arcpy.devices.context import Context
from arcpy.devices.cuda import CudaDevice
from arcpy.devices.cuda_model import CudaModel
from arcpy.errors import InvalidArgumentError
from arcpy.model import Model
from arcpy.parallel.comm import Communicator, create_all, nccl_library, unique_id
from arcpy.parallel.devices import TensorParallelDevice
from arcpy.parallel.shard import ShardPlan, shard_model


def open_tensor_parallel(model: Model, devices, max_seq: int | None = None, use_graph: bool = True,
                         library: str | None = None) -> TensorParallelDevice:
    """`model` split over the GPUs `devices` (indices), in order: the plan (refusing what cannot
    split), a context and a communicator per GPU, each rank's shard uploaded, one warm-up forward
    of every rank together (their sums wait for each other), the graphs captured rank by rank.
    `library`: NCCL's path (default: the nvidia-nccl wheel's, else the system's)."""
    plan = ShardPlan.of(model, len(devices))
    if not use_graph:
        raise InvalidArgumentError("tensor parallel runs the device loop's graphs: not with the graphs off")
    library = library or nccl_library()
    ctxs, ranks = [], []
    try:
        for d in devices:
            ctxs.append(Context(d))
        if len(ctxs) == 1:
            Communicator(ctxs[0], unique_id(library), 1, 0, library)
        else:
            create_all(ctxs, library)
        for r, ctx in enumerate(ctxs):
            forward = CudaModel(ctx, shard_model(model, plan, r), max_seq or model.config.max_seq)
            dev = CudaDevice(ctx, forward, owns_context=True)
            ranks.append(dev)
            dev.supports_prefill, dev.prefix_granule, dev.prefix_row_bytes = False, 0, 0
        for dev in ranks:  # every rank's warm-up forward enqueued before any waits: each sum needs all
            dev.set_input(0, 0)
            dev.forward.enqueue(dev.loop)
        for dev in ranks:
            dev.ctx.wait_idle()
        for dev in ranks:
            dev.capture()
        return TensorParallelDevice(ranks)
    except BaseException:
        for dev in ranks:
            dev.close()
        for ctx in ctxs[len(ranks):]:
            ctx.close()
        raise
