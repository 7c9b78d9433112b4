// decode_layout.cuh -- the decode attention's (attention.cu) sizes and its shared memory: the
// block's heads and warps, the grid's target, the partials' slots, the tiles' stages; and how a kv
// head's positions are divided among blocks (attention_wide.cu divides them the same way).
#pragma once

#include "attention_tile.cuh"
#include "kv_cache.cuh"

enum { DEC_HEADS = 16, DEC_WARPS = ATTN_TILE_THREADS / 32, DEC_TARGET_BLOCKS = 256, DEC_MAX_SPLITS = 256,
       DEC_MERGE_BATCH = 16, DEC_Q8_STAGES = 3 };

static constexpr size_t dec_max(size_t a, size_t b) { return a > b ? a : b; }
// The tiles' bytes: two stages of a k and a v tile of bf16, or DEC_Q8_STAGES of codes, and at
// least what the walk leaves there (the warps' outputs, then the merge's weights).
static constexpr size_t dec_tile_bytes(int D, bool q8) {
    return q8 ? dec_max(dec_max((size_t)DEC_Q8_STAGES * 2 * ATTN_TILE * D, (size_t)DEC_WARPS * DEC_HEADS * D * 4),
                        (size_t)DEC_HEADS * DEC_MAX_SPLITS * 4)
              : (size_t)2 * 2 * ATTN_TILE * D * 2;
}
// Dynamic shared memory of the kernel for D: the tiles, q as hi and lo tiles, the rotation's
// cosines and sines; a q8_0 cache's scales after them, each stage's k's and v's (float16), then
// the current tile's k's and v's as floats.
static constexpr size_t dec_smem_bytes(int D, bool q8) {
    return dec_tile_bytes(D, q8) + (size_t)2 * DEC_HEADS * D * 2 + (size_t)D * 4 +
           (q8 ? (size_t)DEC_Q8_STAGES * 2 * ATTN_TILE * (D / KV_Q8_BLOCK) * 2 +
                     (size_t)2 * ATTN_TILE * (D / KV_Q8_BLOCK) * 4
               : 0);
}
// The tiles' buffers hold, after the walk, the warps' outputs and then the merge's weights.
static_assert(DEC_WARPS * DEC_HEADS * 4 <= 2 * 2 * ATTN_TILE * 2, "the warps' outputs fit the tiles");
static_assert(DEC_HEADS * DEC_MAX_SPLITS * 4 <= 2 * 2 * ATTN_TILE * 32 * 2, "the weights fit the smallest tiles");

// The partials' row stride: a slot for every tile of max_seq, at most DEC_MAX_SPLITS.
inline int tiles_splits(int32_t max_seq) {
    const int tiles = (max_seq + ATTN_TILE - 1) / ATTN_TILE;
    return tiles < DEC_MAX_SPLITS ? tiles : DEC_MAX_SPLITS;
}

// The blocks a kv head's positions are divided among: about DEC_TARGET_BLOCKS in the grid (two
// blocks a multiprocessor on a 132-SM card; the same on every card, so that the bits do not depend
// on it), at most one a slot. Blocks past a short position return at once.
inline int tiles_blocks(int32_t head_tiles, int splits) {
    const int per = (DEC_TARGET_BLOCKS + head_tiles - 1) / head_tiles;
    return per < splits ? per : splits;
}
