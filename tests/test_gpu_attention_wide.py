"""GPU tier: attention for heads past 256 elements (marker `gpu`), libarc's SIMT kernel
(attention_wide.cu) for Gemma 4's full-attention layers (heads of 512, groups of 8 and 16):

- the verify's rows (arc_op_attention_sinks, rows 8, sinks NULL) are, as bits, the one-row
  launches' (arc_op_attention) at the same positions, each row near the NumPy float32 reference,
  with the cache the one-row launches leave; rows past the cache's end are NaN in both;
- the prefill (arc_op_prefill_attention) gives each query the same bits whatever chunk it is in:
  one call over the whole range against calls of 1, 37, 100 and the rest, from position 0 and from
  a late start.

tests/test_gpu_kernels.py checks the one-row launch and tests/test_gpu_prefill.py the prefill
against NumPy at these widths; tests/test_gpu_attention_sinks.py the three with sinks.
"""

from __future__ import annotations

import numpy as np
import pytest
from bf16_words import from_bf16, random_bf16
from gpu_buffers import assert_close, f32p, u16p
from test_gpu_kernels import inv_freq_table, np_attention, np_rope

from arcpy import _lib

pytestmark = pytest.mark.gpu

F32 = np.float32
ROWS = 8  # the current token and 7 drafts


# (head_dim, n_heads, n_kv_heads, first row's position, max_seq): Gemma 4's groups of 8 (32/4) and
# 16 (32/2), where one block writes the output (56..63), where rows cross a tile of 64 (60) and
# where the last block merges many (2990); 320 with a group of 16; 264 (uneven halves of a dot)
# with a group of 20 (blocks of 16 and 4 heads); rows reaching past the cache's end (4092).
VERIFY_CASES = [(512, 32, 4, 56, 4096), (512, 32, 4, 60, 4096), (512, 32, 4, 2990, 4096), (512, 32, 2, 2990, 4096),
                (320, 16, 1, 1000, 2048), (264, 20, 1, 500, 1024), (512, 16, 2, 4092, 4096)]


@pytest.mark.parametrize("hd,n_heads,n_kv,p,max_seq", VERIFY_CASES)
def test_verify_rows_are_the_one_row_launches_bits(gpu, hd, n_heads, n_kv, p, max_seq):
    rng = np.random.default_rng(hd * 100_000 + n_heads * 1000 + p)
    inv_freq = inv_freq_table(hd)
    q_dim, kv_dim = n_heads * hd, n_kv * hd
    width = q_dim + 2 * kv_dim
    qkv = rng.standard_normal((ROWS, width), dtype=F32) * F32(2.0)
    k0 = random_bf16(rng, (n_kv, max_seq, hd))
    v0 = random_bf16(rng, (n_kv, max_seq, hd))
    k0[:, p:] = 0xFFFF  # NaN: read only once a row has stored it
    v0[:, p:] = 0xFFFF
    d_f = gpu.upload(inv_freq)
    sb = gpu.ffi.new("uint64_t *")
    _lib.check(gpu.lib.arc_op_attention_scratch_bytes(n_heads, hd, max_seq, sb))
    sb = int(sb[0])

    # The decode: one launch a row, each reading the rows the launches before it stored.
    d_k, d_v, d_s, d_o = gpu.upload(k0), gpu.upload(v0), gpu.alloc(sb), gpu.alloc(q_dim * 4)
    one = []
    for i in range(ROWS):
        gpu.poison(d_o, q_dim * 4)
        _lib.check(gpu.lib.arc_op_attention(gpu.ctx, f32p(gpu, gpu.upload(qkv[i])), f32p(gpu, d_f), u16p(gpu, d_k),
                                            u16p(gpu, d_v), n_heads, n_kv, hd, max_seq, gpu.position(p + i),
                                            f32p(gpu, d_s), f32p(gpu, d_o)))
        one.append(gpu.read(d_o, F32, q_dim))
    one = np.stack(one)
    k_one = gpu.read(d_k, np.uint16, k0.size).reshape(k0.shape)
    v_one = gpu.read(d_v, np.uint16, v0.size).reshape(v0.shape)

    # The verify: every row's k and v stored, then the rows attended in one launch.
    d_k2, d_v2, d_s2 = gpu.upload(k0), gpu.upload(v0), gpu.alloc(ROWS * sb)
    d_pos = gpu.upload(np.arange(p, p + ROWS, dtype=np.int32))
    d_done = gpu.upload(np.zeros(ROWS * n_heads, dtype=np.uint32))
    d_o2 = gpu.alloc(ROWS * q_dim * 4)
    gpu.poison(d_s2, ROWS * sb)
    gpu.poison(d_o2, ROWS * q_dim * 4)
    _lib.check(gpu.lib.arc_op_attention_sinks(gpu.ctx, f32p(gpu, gpu.upload(qkv)), ROWS,
                                              gpu.ffi.cast("int32_t *", d_pos), f32p(gpu, d_f), u16p(gpu, d_k2),
                                              u16p(gpu, d_v2), n_heads, n_kv, hd, max_seq, gpu.ffi.NULL,
                                              f32p(gpu, d_s2), gpu.ffi.cast("uint32_t *", d_done), f32p(gpu, d_o2)))
    rows = gpu.read(d_o2, F32, ROWS * q_dim).reshape(ROWS, q_dim)

    for i in range(ROWS):
        if p + i >= max_seq:
            assert np.isnan(one[i]).all() and np.isnan(rows[i]).all(), f"row {i} past the cache is not NaN"
            continue
        diff = np.flatnonzero(rows[i].view(np.uint32) != one[i].view(np.uint32))
        assert diff.size == 0, (f"row {i}: {diff.size} outputs differ from the one-row launch's as bits, first "
                                f"{diff[:3].tolist()}: {rows[i][diff[:3]].tolist()} vs {one[i][diff[:3]].tolist()}")
        q_rot = np_rope(qkv[i, :q_dim].reshape(n_heads, hd), p + i, inv_freq)
        want = np_attention(q_rot, from_bf16(k_one[:, : p + i + 1]), from_bf16(v_one[:, : p + i + 1]), p + i, n_kv)
        assert_close(f"row {i} at {p + i}, hd {hd} heads {n_heads}/{n_kv}", one[i], want, 2e-5, 1e-4)
    assert np.array_equal(gpu.read(d_k2, np.uint16, k0.size), k_one.ravel()), "k cache"
    assert np.array_equal(gpu.read(d_v2, np.uint16, v0.size), v_one.ravel()), "v cache"
    assert not gpu.read(d_done, np.uint32, ROWS * n_heads).any(), "the tickets were not left zeroed"


# (head_dim, n_heads, n_kv_heads, start, total): the queries start..start + total - 1, in one call
# and in calls of 1, 37, 100 and the rest; groups of 8 (two queries a block), 16 (one) and 1 (four).
CHUNK_CASES = [(512, 16, 2, 0, 300), (512, 32, 2, 2900, 200), (320, 4, 4, 40, 180)]
PIECES = (1, 37, 100)


def prefill_calls(gpu, qkv, d_f, k0, v0, hd, n_heads, n_kv, start, sizes, max_seq):
    """arc_op_prefill_attention over qkv's rows in calls of `sizes` from start, on fresh copies of the
    caches: (out (rows, n_heads * hd) bf16 words, k cache, v cache)."""
    d_k, d_v = gpu.upload(k0), gpu.upload(v0)
    width, outs, at = qkv.shape[1], [], 0
    for n in sizes:
        d_q, d_o = gpu.alloc(n * n_heads * hd * 2), gpu.alloc(n * n_heads * hd * 2)
        gpu.poison(d_o, n * n_heads * hd * 2)
        need = gpu.ffi.new("uint64_t *")
        _lib.check(gpu.lib.arc_op_prefill_attention_scratch_bytes(n_heads, hd, n, start + at, need))
        assert need[0] == 0, "heads past 256 take no partials"
        _lib.check(gpu.lib.arc_op_prefill_attention(gpu.ctx, f32p(gpu, gpu.upload(qkv[at:at + n])), f32p(gpu, d_f),
                                                    u16p(gpu, d_k), u16p(gpu, d_v), n_heads, n_kv, hd, max_seq, n,
                                                    start + at, u16p(gpu, d_q), gpu.ffi.NULL, u16p(gpu, d_o)))
        outs.append(gpu.read(d_o, np.uint16, n * n_heads * hd).reshape(n, n_heads * hd))
        at += n
    assert at == qkv.shape[0] and width == (n_heads + 2 * n_kv) * hd
    return np.concatenate(outs), gpu.read(d_k, np.uint16, k0.size), gpu.read(d_v, np.uint16, v0.size)


@pytest.mark.parametrize("hd,n_heads,n_kv,start,total", CHUNK_CASES)
def test_prefill_queries_do_not_depend_on_their_chunk(gpu, hd, n_heads, n_kv, start, total):
    rng = np.random.default_rng(hd * 10_000 + start + total)
    max_seq = start + total + 16
    qkv = rng.standard_normal((total, (n_heads + 2 * n_kv) * hd), dtype=F32)
    qkv[:, : n_heads * hd] *= F32(2.0)
    k0 = np.full((n_kv, max_seq, hd), 0xFFFF, dtype=np.uint16)  # this range's rows and those after: NaN
    v0 = np.full((n_kv, max_seq, hd), 0xFFFF, dtype=np.uint16)
    k0[:, :start] = random_bf16(rng, (n_kv, start, hd))
    v0[:, :start] = random_bf16(rng, (n_kv, start, hd))
    d_f = gpu.upload(inv_freq_table(hd))

    whole = prefill_calls(gpu, qkv, d_f, k0, v0, hd, n_heads, n_kv, start, [total], max_seq)
    sizes = list(PIECES) + [total - sum(PIECES)]
    pieces = prefill_calls(gpu, qkv, d_f, k0, v0, hd, n_heads, n_kv, start, sizes, max_seq)
    assert np.isfinite(from_bf16(whole[0])).all(), "the whole range's output is not finite"
    for i in range(total):
        diff = np.flatnonzero(whole[0][i] != pieces[0][i])
        assert diff.size == 0, f"query {i} (position {start + i}): {diff.size} outputs differ between the chunkings"
    assert np.array_equal(whole[1], pieces[1]) and np.array_equal(whole[2], pieces[2]), "the caches differ"
