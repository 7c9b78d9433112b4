"""A GPU context for the kernel tests and the buffers each test allocates, through libarc's C entry
points alone; typed views of device pointers; a step graph over prepared logits, for the
loop's tests on an arcpy Context; the logits of a device's forward and its KV cache, read on the host; the
GPU device over a synthetic model with its engines (the fixture `device`, imported by name); and
the float64 log_softmax the log-probabilities are held to; and the float64 closeness check of
the kernels' outputs."""

import time

import numpy as np
import pytest

from arcpy import _lib
from arcpy.devices.context import sequence_struct
from arcpy.devices.cuda import open_cuda_device
from arcpy.devices.reference import ReferenceModel
from arcpy.loop.engine import Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.settings import EngineSettings
from arcpy.model import synthetic_model


class Gpu:
    """A context and the buffers the current test allocated (freed after each test)."""

    def __init__(self):
        self.ffi, self.lib = _lib.load()
        pp = self.ffi.new("arc_context **")
        _lib.check(self.lib.arc_context_create(0, pp))
        self.ctx = pp[0]
        self.device_bufs, self.host_bufs, self.keep = [], [], []

    def wait(self, timeout_s: float = 120.0) -> None:
        """Poll arc_stream_query until the stream is idle (0); an error status raises."""
        deadline = time.monotonic() + timeout_s
        while _lib.check(self.lib.arc_stream_query(self.ctx)) != 0:
            if time.monotonic() > deadline:
                pytest.fail(f"the stream was still busy after {timeout_s} s")
            time.sleep(20e-6)

    def alloc(self, nbytes: int):
        p = self.ffi.new("void **")
        _lib.check(self.lib.arc_device_alloc(self.ctx, max(int(nbytes), 16), p))
        self.device_bufs.append(p[0])
        return p[0]

    def put(self, dst, array: np.ndarray, offset: int = 0) -> None:
        array = np.ascontiguousarray(array)
        self.keep.append(array)
        dst = self.ffi.cast("char *", dst) + offset
        _lib.check(self.lib.arc_enqueue_copy_to_device(self.ctx, dst, self.ffi.from_buffer(array), array.nbytes))

    def upload(self, array: np.ndarray):
        d = self.alloc(array.nbytes)
        self.put(d, array)
        return d

    def poison(self, ptr, nbytes: int) -> None:
        """All-ones bytes: a NaN in every float32 and every bf16 word."""
        self.put(ptr, np.full(int(nbytes), 0xFF, dtype=np.uint8))

    def pinned(self, nbytes: int):
        """(host view as bytes, device pointer) of a pinned, mapped buffer."""
        h, d = self.ffi.new("void **"), self.ffi.new("void **")
        _lib.check(self.lib.arc_host_alloc(self.ctx, max(int(nbytes), 16), h, d))
        self.host_bufs.append(h[0])
        return h[0], d[0]

    def read(self, src, dtype, count: int) -> np.ndarray:
        """Copy `count` items from device memory into pinned memory, wait, return a copy."""
        nbytes = int(count) * np.dtype(dtype).itemsize
        h, _ = self.pinned(nbytes)
        _lib.check(self.lib.arc_enqueue_copy_to_host(self.ctx, h, src, nbytes))
        self.wait()
        return np.frombuffer(self.ffi.buffer(self.ffi.cast("char *", h), nbytes), dtype).copy()

    def token(self, value: int):
        """A pinned, mapped u32 holding `value`: what the forward's token pointer points at."""
        h, d = self.pinned(4)
        np.frombuffer(self.ffi.buffer(self.ffi.cast("char *", h), 4), np.uint32)[0] = value
        return self.ffi.cast("uint32_t *", d)

    def position(self, value: int):
        return self.ffi.cast("int32_t *", self.upload(np.array([value], dtype=np.int32)))

    def free_all(self) -> None:
        self.wait()
        for p in self.device_bufs:
            self.lib.arc_device_free(self.ctx, p)
        for p in self.host_bufs:
            self.lib.arc_host_free(self.ctx, p)
        self.device_bufs, self.host_bufs, self.keep = [], [], []

    def close(self) -> None:
        self.free_all()
        self.lib.arc_context_destroy(self.ctx)


def begin(ffi, lib, loop, **parts) -> int:
    """arc_loop_begin_sequence writing the parts given (arcpy.devices.context.sequence_struct): its status."""
    seq, _keep = sequence_struct(ffi, lib, **parts)
    return lib.arc_loop_begin_sequence(loop, seq)


def u16p(gpu, p):
    return gpu.ffi.cast("uint16_t *", p)


def f32p(gpu, p):
    return gpu.ffi.cast("float *", p)


def host_logits(dev) -> np.ndarray:
    """The device's logits handed to the host, once its stream is idle (spun on stream_query)."""
    dev.enqueue_logits_to_host()
    while not dev.stream_query():
        pass
    return dev.host_logits()


def assert_close(what, got, want, atol, rtol) -> None:
    """|got - want| <= atol + rtol * |want| everywhere (atol a scalar or broadcast to want), got
    finite; else the first mismatches."""
    want = np.asarray(want, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64).reshape(want.shape)
    tol = (np.broadcast_to(np.asarray(atol, dtype=np.float64), want.shape) + rtol * np.abs(want)).ravel()
    got, want = got.ravel(), want.ravel()
    assert np.isfinite(want).all(), f"{what}: the NumPy reference itself is not finite"
    diff = np.abs(got - want)
    bad = ~np.isfinite(got) | (diff > tol)
    if bad.any():
        idx = np.flatnonzero(bad)
        lines = [f"  [{i}] got {got[i]!r} want {want[i]!r} diff {diff[i]:.3g} tol {tol[i]:.3g}" for i in idx[:10]]
        pytest.fail(f"{what}: {idx.size} of {got.size} out of tolerance; first:\n" + "\n".join(lines))


def kv_cache_pointers(dev):
    """The device's KV cache: the k and v blocks' device pointers (arc_model_kv_cache)."""
    k, v = dev.ffi.new("uint16_t **"), dev.ffi.new("uint16_t **")
    _lib.check(dev.lib.arc_model_kv_cache(dev.forward.ptr, k, v))
    return k[0], v[0]


def kv_cache_shape(dev) -> tuple[int, int, int, int]:
    """Each of k's and v's (attention layers, kv heads, max_seq, head_dim) (arc_model_kv_cache)."""
    blocks, heads, max_seq, hd = dev.forward.kv_shape
    return (blocks // 2, heads, max_seq, hd)


def kv_cache_rows(dev, n: int | None = None, host: np.ndarray | None = None) -> list[np.ndarray]:
    """The KV cache's rows 0..n-1 (all with n None) of every attention layer and kv head, as bf16
    words: [k, v], each (attention layers, kv heads, n, head_dim); through the pinned uint16 array
    `host` of one block's size where given (pinned memory lives as long as the context)."""
    shape = kv_cache_shape(dev)
    if host is None:
        host, _ = dev.ctx.pinned((int(np.prod(shape)),), np.uint16)
    out = []
    for p in kv_cache_pointers(dev):
        dev.ctx.download_async(host, p)
        dev.ctx.wait_idle()
        out.append(host.reshape(shape)[:, :, :n].copy())
    return out


def kv_planes(dev, n: int | None = None) -> list[np.ndarray]:
    """Every plane of the device's KV cache in any form (arc_model_kv_planes: a bf16 cache's k and
    v values, a q8_0 cache's k and v codes then their scales), rows 0..n-1 (all with n None) of
    each (attention layer, kv head): bytes, (layers * kv heads, n, row bytes) each. Every head of
    the cache of the same width (not a Gemma 4 model's wider global heads)."""
    runs = dev.forward.kv_runs
    assert set(runs) == {dev.forward.kv_head_dim}, "the cache's heads differ in width"
    out = []
    for base, row, rows in dev.forward.kv_planes:
        host, _ = dev.ctx.pinned((len(runs) * rows * row,), np.uint8)
        dev.ctx.download_async(host, base)
        dev.ctx.wait_idle()
        out.append(host.reshape(len(runs), rows, row)[:, :n].copy())
    return out


def gpu_logits(dev, token: int, pos: int, eager: bool = False) -> np.ndarray:
    """The logits of the device's forward of `token` at `pos`, on the host."""
    dev.set_input(token, pos)
    dev.enqueue_forward(eager=eager)
    return host_logits(dev)


def decided_greedy_steps(model, dev, max_seq: int, steps: int = 64) -> tuple[int, int]:
    """Greedy steps from token 1 on the device against the reference forward of `model`, both
    following the device's choice: (agreed, checked) over the steps whose reference margin (its
    top two logits) exceeds twice the device's largest logit error, where the argmax is decided."""
    ref = ReferenceModel(model, max_seq=max_seq)
    token, checked, agreed = 1, 0, 0
    for pos in range(steps):
        want = ref.forward(token, pos)
        got = gpu_logits(dev, token, pos)
        err = float(np.max(np.abs(got.astype(np.float64) - want)))
        top2 = np.sort(want)[-2:]
        if top2[1] - top2[0] > 2 * err:
            checked += 1
            agreed += int(np.argmax(got)) == int(np.argmax(want))
        token = int(np.argmax(got))
    return agreed, checked


@pytest.fixture(scope="module", params=["stories15M", "gqa"])
def device(request):
    """The GPU device over a synthetic model of each shape (seed 3, 1,024 positions)."""
    dev = open_cuda_device(synthetic_model(request.param, seed=3), max_seq=1024)
    dev.name_of_shape = request.param
    yield dev
    dev.close()


def engine(dev, loop, burst=4):
    return Engine(dev, "cuda", EngineSettings(device_loop=loop, burst=burst), environ={}, latch=FallbackLatch())


class CopyStep:
    """A step graph whose forward copies prepared logits (a capturable device-to-device copy),
    then samples and commits, and with `logprobs` writes the log-probabilities: the loop's kernels
    on logits the test chooses, on a Context. The sampler is the draw with `sampling` (set before
    the capture) or `draw` (sampling set later), else the argmax."""

    def __init__(self, ctx, x: np.ndarray, loop_vocab: int, max_seq: int = 64, capacity: int = 16,
                 sampling=None, draw: bool = False, logprobs: bool = False):
        self.ctx, ffi, lib = ctx, ctx.ffi, ctx.lib
        width = x.size
        self.src, self.logits = ctx.device_alloc(x.nbytes), ctx.device_alloc(x.nbytes)
        ctx.upload_async(self.src, x)
        lp = ffi.new("arc_loop **")
        _lib.check(lib.arc_loop_create(ctx.ptr, loop_vocab, max_seq, capacity, lp))
        self.loop = lp[0]
        if sampling is not None:
            _lib.check(begin(ffi, lib, self.loop, sampling=sampling))
        if logprobs:
            _lib.check(begin(ffi, lib, self.loop, top_logprobs=0))  # the ring, before the capture
        draw = draw or sampling is not None
        commit = lib.arc_loop_enqueue_draw_commit if draw else lib.arc_loop_enqueue_sample_commit
        _lib.check(lib.arc_graph_capture_begin(ctx.ptr))
        try:
            _lib.check(lib.arc_enqueue_copy_on_device(ctx.ptr, self.logits, self.src, x.nbytes))
            _lib.check(commit(self.loop, self.logits, width))
            if logprobs:
                _lib.check(lib.arc_loop_enqueue_logprobs(self.loop, self.logits, width))
        finally:
            gp = ffi.new("arc_graph **")
            status = lib.arc_graph_capture_end(ctx.ptr, gp)
        _lib.check(status)
        self.graph = gp[0]
        ctx.wait_idle()

    def run(self, token: int, position: int, steps: int, setup=None):
        """`steps` steps from (token, position) on a reset ring, `setup(loop)` first; the ring's state."""
        ffi, lib = self.ctx.ffi, self.ctx.lib
        _lib.check(begin(ffi, lib, self.loop, reset=True, token_input=(token, position)))
        if setup is not None:
            setup(self.loop)
        for _ in range(steps):
            _lib.check(lib.arc_loop_enqueue_step(self.loop, self.graph, 1))
        self.ctx.wait_idle()
        state = ffi.new("arc_ring_state *")
        _lib.check(lib.arc_ring_poll(self.loop, state))
        return state

    def close(self):
        self.ctx.wait_idle()
        self.ctx.lib.arc_graph_destroy(self.graph)
        self.ctx.lib.arc_loop_destroy(self.loop)
        self.ctx.device_free(self.src)
        self.ctx.device_free(self.logits)


def log_softmax64(x):
    """log_softmax of x in float64, its maximum taken over the finite values (-inf ids allowed)."""
    x = np.asarray(x, dtype=np.float64)
    top = x[np.isfinite(x)].max()
    return x - (top + np.log(np.sum(np.exp(x - top))))


def assert_refused_changing_nothing(gpu, cases, buffers, inits) -> None:
    """Each (message, call) of `cases` returns ARC_INVALID_ARGUMENT and, through _lib.check, raises
    InvalidArgumentError naming `message`; then nothing failed on the device and every buffer
    (`buffers[name]`, uploaded from `inits[name]`) still holds its first bytes."""
    import arcpy
    lib = gpu.lib
    for message, call in cases:
        assert call() == lib.ARC_INVALID_ARGUMENT, message
        with pytest.raises(arcpy.InvalidArgumentError, match=message) as info:
            _lib.check(call())
        assert info.value.status == lib.ARC_INVALID_ARGUMENT
    gpu.wait()  # nothing was launched, and nothing failed on the device
    for name, a in inits.items():
        got = gpu.read(buffers[name], np.uint8, a.nbytes)
        assert got.tobytes() == a.tobytes(), f"{name} was changed"
