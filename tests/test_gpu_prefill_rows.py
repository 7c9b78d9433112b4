"""GPU tier: a prefill row's bits do not depend on the chunk it was computed in (marker `gpu`).

The prefix cache reuses KV rows an earlier prefill wrote wherever a cold prefill would write the
same bits. These tests measure where that holds: each matrix product's rows computed with m rows
against the same rows computed inside a product of 2,048 (every tile shape and both kernels the
products choose among by m), and whole prefills of one prompt split at different positions
against the same prompt in one call: KV rows and the last token's logits, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_buffers import kv_cache_rows

from arcpy import _lib
from arcpy.devices.cuda import open_cuda_device
from arcpy.model import synthetic_model

pytestmark = pytest.mark.gpu


def bf16(rng, shape, scale=1.0):
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    return (x.view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.parametrize("n,k", [(2048, 2048), (8192, 2048), (576, 576), (49152, 576)])
@pytest.mark.parametrize("accumulate", [0, 1])
def test_gemm_rows_do_not_depend_on_the_row_count(ctx, n, k, accumulate):
    rng = np.random.default_rng(n + k)
    m_full = 2048
    a, w = bf16(rng, (m_full, k)), bf16(rng, (n, k), 0.05)
    c0 = rng.standard_normal((m_full, n)).astype(np.float32)
    da, dw, dc = ctx.device_alloc(a.nbytes), ctx.device_alloc(w.nbytes), ctx.device_alloc(c0.nbytes)
    ctx.upload_async(da, a)
    ctx.upload_async(dw, w)
    host, _ = ctx.pinned((m_full * n,), np.float32)
    ffi, lib = ctx.ffi, ctx.lib

    def product(r0, m):
        ctx.upload_async(dc, c0[r0:r0 + m])
        _lib.check(lib.arc_op_gemm_bf16(ctx.ptr, ffi.cast("uint16_t *", da) + r0 * k, ffi.cast("uint16_t *", dw),
                                        m, n, k, ffi.NULL, accumulate, ffi.cast("float *", dc)))
        ctx.download_async(host[:m * n], dc)
        ctx.wait_idle()
        return host[:m * n].reshape(m, n).copy()

    full = product(0, m_full)
    differ = {}
    for r0, m in [(0, 1), (5, 7), (64, 64), (100, 100), (129, 129), (300, 300), (700, 700), (1000, 1024), (0, 1500)]:
        got = product(r0, m)
        bad = np.count_nonzero(got.view(np.uint32) != full[r0:r0 + m].view(np.uint32))
        if bad:
            differ[(r0, m)] = bad
    for p in (da, dw, dc):
        ctx.device_free(p)
    assert not differ, f"rows differ from the 2048-row product's (start, rows: words): {differ}"


def prefill(dev, tokens, splits):
    """The prompt through the prefill in pieces starting at 0 and each split; the last logits."""
    bounds = [0, *splits, len(tokens)]
    for a, b in zip(bounds, bounds[1:]):
        dev.enqueue_prefill(tokens[a:b], a)
        dev.ctx.wait_idle()
    dev.enqueue_logits_to_host()
    while not dev.stream_query():
        pass
    return dev.host_logits()


@pytest.mark.parametrize("shape", ["smollm2-135M", "llama1B-q4km", "gemma3-tiny", "qwen3-tiny", "phi3-tiny", "tiny-quant"])
def test_a_prefill_split_anywhere_writes_the_rows_of_one_in_one_piece(shape):
    model = synthetic_model(shape, seed=5, max_seq=4096)
    cfg = model.config
    n = 3000
    tokens = np.random.default_rng(2).integers(0, cfg.vocab, n).tolist()
    with open_cuda_device(model, max_seq=cfg.max_seq) as dev:
        host, _ = dev.ctx.pinned((cfg.n_layers * cfg.n_kv_heads * cfg.max_seq * cfg.head_dim,), np.uint16)
        whole_logits = prefill(dev, tokens, [])
        whole = kv_cache_rows(dev, n, host)
        differ = {}
        for splits in ([1], [100], [1000], [2047], [2048], [2500], [700, 2900]):
            logits = prefill(dev, tokens, splits)
            rows = kv_cache_rows(dev, n, host)
            bad = [int(np.count_nonzero(r != w)) for r, w in zip(rows, whole)]
            if any(bad) or not np.array_equal(logits.view(np.uint32), whole_logits.view(np.uint32)):
                first = [int(np.argmax((r != w).any(axis=(0, 1, 3)))) if b else None for r, w, b in zip(rows, whole, bad)]
                differ[tuple(splits)] = (bad, first)
    assert not differ, f"split prefills differ (splits: (k, v words), first position): {differ}"
