"""The all-reduce's communicator (libarc/comm.cu, arcpy/parallel/comm.py): on the CPU, what is
refused before NCCL or a GPU is needed; on the GPU (marker `gpu`), a world of one rank through
NCCL, captured into a graph and replayed."""

import time

import numpy as np
import pytest

from arcpy import _lib
from arcpy.errors import InvalidArgumentError, NoDeviceError
from arcpy.parallel.comm import ID_BYTES, Communicator, nccl_library, unique_id


def test_a_missing_nccl_is_one_clear_error():
    with pytest.raises(NoDeviceError, match="cannot load NCCL from /nonexistent/libnccl.so.2"):
        unique_id("/nonexistent/libnccl.so.2")


def test_a_library_that_is_not_nccl_is_refused():
    with pytest.raises(NoDeviceError, match="has no ncclGetUniqueId: not an NCCL library"):
        unique_id("libc.so.6")


def test_bad_arguments_are_refused_before_any_nccl_call():
    ffi, lib = _lib.load()
    out = ffi.new("arc_comm **")
    assert lib.arc_comm_create(ffi.NULL, ffi.NULL, bytes(ID_BYTES), 1, 0, out) == 2  # ARC_INVALID_ARGUMENT
    assert lib.arc_comm_all_reduce(ffi.NULL, ffi.NULL, ffi.NULL, 4) == 2
    assert lib.arc_comm_destroy(ffi.NULL) == 0  # nothing to destroy

    ctx = type("Ctx", (), {"ffi": ffi, "lib": lib, "ptr": ffi.NULL})()
    with pytest.raises(InvalidArgumentError, match="rank 2 of world 2"):
        Communicator(ctx, bytes(ID_BYTES), 2, 2)
    with pytest.raises(InvalidArgumentError, match="128 bytes"):
        Communicator(ctx, b"short", 1, 0)


def capture(ctx, enqueue):
    _lib.check(ctx.lib.arc_graph_capture_begin(ctx.ptr))
    try:
        enqueue()
    finally:
        gp = ctx.ffi.new("arc_graph **")
        status = ctx.lib.arc_graph_capture_end(ctx.ptr, gp)
    _lib.check(status)
    nodes = ctx.ffi.new("uint64_t *")
    _lib.check(ctx.lib.arc_graph_node_count(gp[0], nodes))
    return gp[0], int(nodes[0])


@pytest.mark.gpu
def test_gpu_a_world_of_one_all_reduces_in_a_captured_graph():
    from arcpy.devices.context import Context

    library = nccl_library()
    with Context(0) as ctx:
        try:
            comm = Communicator(ctx, unique_id(library), 1, 0, library)
        except NoDeviceError as exc:
            pytest.skip(f"no NCCL on this machine: {exc}")
        try:
            world, rank, version = comm.info()
            assert (world, rank) == (1, 0) and version >= 20000
            n = 4096  # a 4096-dim model's residual stream
            x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
            bufs = [ctx.device_alloc(4 * n) for _ in range(2)]
            send, recv = (ctx.ffi.cast("float *", b) for b in bufs)
            ctx.upload_async(bufs[0], x)
            ctx.upload_async(bufs[1], np.full(n, np.nan, np.float32))
            graph, nodes = capture(ctx, lambda: [comm.all_reduce(send, recv, n) for _ in range(64)])
            assert nodes >= 64  # NCCL's work is in the graph: a node or more an all-reduce
            _lib.check(ctx.lib.arc_graph_launch(graph))
            ctx.wait_idle()
            t0 = time.perf_counter()
            for _ in range(10):
                _lib.check(ctx.lib.arc_graph_launch(graph))
            ctx.wait_idle()
            per = (time.perf_counter() - t0) / 640
            out, _ = ctx.pinned((n,), np.float32)
            ctx.download_async(out, bufs[1])
            ctx.wait_idle()
            assert np.array_equal(out, x)  # the sum over one rank is the rank's own
            in_place, none = capture(ctx, lambda: comm.all_reduce(send, send, n))
            assert none == 0  # in place, a world of one has nothing to do
            print(f"\nNCCL {version}: a world of one, {n} floats out of place, {per * 1e6:.2f} us an all-reduce in a "
                  f"graph ({nodes} nodes for 64); in place: {none} nodes")
            for g in (graph, in_place):
                _lib.check(ctx.lib.arc_graph_destroy(g))
            for b in bufs:
                ctx.device_free(b)
        finally:
            comm.close()
