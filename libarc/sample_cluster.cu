// sample_cluster.cu -- the draw (sample.cu's definition) inside one thread-block cluster (compute
// capability 9.0), for vocabularies that fit one cluster of CD_THREADS-thread blocks at 8 ids a
// thread (16 * 512 * 8 = 65,536 ids on the H200; above that sample.cu's grid-wide draw is faster, the
// cluster's 16 multiprocessors computing every weight). The blocks meet at the cluster's hardware
// barrier (about a quarter of a grid barrier's cost) and sum their histograms in each other's
// shared memory, so the draw needs no global scratch. The selections search a 54-bit rank of each
// id, R = (F << 32) | ~key, where F = min(floor(-x * 2^17), 2^22 - 1) and x = (l - m) / T is the
// weight's exponent: F grows as the logit falls, so ascending R is the candidate order (larger
// logit first), and its first two digits split the range where the weights live into cells of
// 1/64 and then 1/131,072 of a unit of x, which on real and synthetic logits leaves a handful of
// ids at the cut after one or two levels. A cell of at most CD_LIST ids is copied to every block
// and resolved there exactly; the last three digits are the key's bits, and a cell of equal keys
// larger than the list is cut by ascending id with an ordered search.

#include <limits.h>

#include <cooperative_groups.h>

#include "sample.cuh"

enum {
    CD_THREADS = 512,
    CD_WARPS = CD_THREADS / 32,
    CD_MAX_BLOCKS = 16,
    CD_MIN_BLOCKS = 8,
    CD_BINS = 2048,
    CD_SLICE = CD_BINS / CD_MIN_BLOCKS,  // the most bins a block owns
    CD_LIST = 32,
    CD_LEVELS = 5,
};

// The digits of R, most significant first: F's two, then the key's three.
__device__ __forceinline__ int cd_shift(int level) {
    return level == 0 ? 43 : level == 1 ? 32 : level == 2 ? 21 : level == 3 ? 10 : 0;
}
__device__ __forceinline__ int cd_width(int level) { return level == 4 ? 10 : 11; }

struct ClusterShared {
    BlockHistogram h;  // this block's histogram of the level
    // The cluster's sums of the bins this block owns (one buffer per level, rotating), and of every
    // block's slice of bins; masses in BlockHistogram's three parts, so every add across blocks is
    // a 32-bit atomic (a part's sum over the cluster stays below 2^14 * 65,536 ids).
    uint32_t g_count[3][CD_SLICE];
    uint32_t g_part[3][3][CD_SLICE];
    uint32_t t_count[3][CD_MAX_BLOCKS];
    uint32_t t_part[3][3][CD_MAX_BLOCKS];
    uint32_t block_max[CD_MAX_BLOCKS];
    uint32_t block_low[CD_MAX_BLOCKS];  // each block's largest ~key: its smallest logit's
    unsigned long long list_r[CD_MAX_BLOCKS][CD_LIST];  // a cut cell's ids, by the block that holds them
    unsigned long long list_q[CD_MAX_BLOCKS][CD_LIST];
    int32_t list_id[CD_MAX_BLOCKS][CD_LIST];
    uint32_t list_n[CD_MAX_BLOCKS];
    uint32_t list_mine;
    unsigned long long part[3][CD_MAX_BLOCKS];  // every block's sum in an ordered search: top-k, top-p, the draw
    int32_t found[2];
    uint32_t warp_max[CD_WARPS];
    uint32_t warp_low[CD_WARPS];
    Pick pick;
    int32_t scan_slice;
    unsigned long long scan_above, scan_want;
    unsigned long long cut_r;
    int32_t cut_id;
};

// The ids kept by a selection: R < r, or R == r and id <= id.
struct Cut {
    unsigned long long r;
    int32_t id;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
namespace cg = cooperative_groups;

__device__ __forceinline__ ClusterShared *cd_remote(cg::cluster_group &cl, ClusterShared *sh, int rank) {
    return cl.map_shared_rank(sh, rank);
}

// One level: the histogram of R's digit over the ids `play` admits, summed into the blocks that
// own its bins, with every block's per-slice sums added into every block; then every block finds
// the same bucket holding the want-th unit of count or of mass (ascending R). With p32 != 0, want
// is ceil(total mass * p32 / 2^32).
template <int E, typename Play>
__device__ Pick cd_level(cg::cluster_group &cl, ClusterShared *sh, int level_no, int level,
                         const unsigned long long (&r)[E], const unsigned long long (&q)[E], Play play, bool by_mass,
                         unsigned long long want, uint64_t p32) {
    const int blocks = gridDim.x, slice = CD_BINS / blocks;
    const int shift = cd_shift(level), nb = 1 << cd_width(level);
    sh->h.clear(CD_THREADS);
    __syncthreads();
#pragma unroll
    for (int e = 0; e < E; ++e) {
        if (play(e)) {
            sh->h.add((uint32_t)(r[e] >> shift) & (uint32_t)(nb - 1), q[e]);
        }
    }
    __syncthreads();
    const int buf = level_no % 3;
    for (int b = threadIdx.x; b < nb; b += CD_THREADS) {
        if (sh->h.count[b]) {
            ClusterShared *o = cd_remote(cl, sh, b / slice);
            atomicAdd(&o->g_count[buf][b % slice], sh->h.count[b]);
#pragma unroll
            for (int k = 0; k < 3; ++k)
                if (sh->h.part[k][b]) atomicAdd(&o->g_part[buf][k][b % slice], sh->h.part[k][b]);
        }
    }
    // Warp w sums slice w of this block's histogram and adds it into every block.
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (warp < blocks) {
        uint32_t c = 0, pt[3] = {0, 0, 0};
        for (int b = warp * slice + lane; b < (warp + 1) * slice; b += 32) {
            c += sh->h.count[b];
#pragma unroll
            for (int k = 0; k < 3; ++k) pt[k] += sh->h.part[k][b];
        }
        c = __reduce_add_sync(0xffffffffu, c);
#pragma unroll
        for (int k = 0; k < 3; ++k) pt[k] = __reduce_add_sync(0xffffffffu, pt[k]);
        if (c && lane < blocks) {
            ClusterShared *o = cd_remote(cl, sh, lane);
            atomicAdd(&o->t_count[buf][warp], c);
#pragma unroll
            for (int k = 0; k < 3; ++k)
                if (pt[k]) atomicAdd(&o->t_part[buf][k][warp], pt[k]);
        }
    }
    cl.sync();
    // The buffer two levels on was last read before this barrier: clear it for its next level.
    const int next = (level_no + 2) % 3;
    for (int b = threadIdx.x; b < slice; b += CD_THREADS) {
        sh->g_count[next][b] = 0;
        sh->g_part[next][0][b] = sh->g_part[next][1][b] = sh->g_part[next][2][b] = 0;
    }
    if (threadIdx.x < blocks) {
        sh->t_count[next][threadIdx.x] = 0;
        sh->t_part[next][0][threadIdx.x] = sh->t_part[next][1][threadIdx.x] = sh->t_part[next][2][threadIdx.x] = 0;
    }
    // Warp 0 finds the slice holding the want-th unit: a scan of the slices' sums.
    if (warp == 0) {
        unsigned long long v = 0;
        if (lane < blocks)
            v = by_mass ? mass_of_parts(sh->t_part[buf][0][lane], sh->t_part[buf][1][lane], sh->t_part[buf][2][lane])
                        : sh->t_count[buf][lane];
        unsigned long long inc = v;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            unsigned long long y = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += y;
        }
        const unsigned long long total = __shfl_sync(0xffffffffu, inc, 31);
        if (p32) want = __umul64hi(total, p32 << 32) + (((total * p32) & 0xffffffffull) != 0);
        const uint32_t reached = __ballot_sync(0xffffffffu, lane < blocks && inc >= want);
        const int first = reached ? __ffs(reached) - 1 : blocks - 1;
        const unsigned long long before = __shfl_sync(0xffffffffu, inc - v, first);
        if (lane == 0) {
            sh->scan_slice = first;
            sh->scan_above = before;
            sh->scan_want = want;
        }
    }
    __syncthreads();
    const int s = sh->scan_slice;
    const unsigned long long above = sh->scan_above;
    want = sh->scan_want;
    ClusterShared *o = cd_remote(cl, sh, s);
    const bool mine = threadIdx.x < slice;
    uint32_t c = mine ? o->g_count[buf][threadIdx.x] : 0u;
    const int t = threadIdx.x;
    unsigned long long m = 0;
    if (mine) m = mass_of_parts(o->g_part[buf][0][t], o->g_part[buf][1][t], o->g_part[buf][2][t]);
    unsigned long long v = by_mass ? m : c, sum;
    unsigned long long before = above + block_scan<CD_THREADS>(v, &sum);
    if (before < want && want <= before + v)
        sh->pick = Pick{(uint32_t)(s * slice + threadIdx.x), c, before, m, want};
    __syncthreads();
    Pick pk = sh->pick;
    __syncthreads();
    return pk;
}

// The first id, in ascending id order, at which the running sum of weight(e) over the cluster
// exceeds target (with `draw`, target = floor(total * x / 2^32)). Only the thread that holds that
// id gets it; every other thread gets -1.
template <int E, typename Weight>
__device__ int cd_ordered_find(cg::cluster_group &cl, ClusterShared *sh, int use, int base, Weight weight,
                               unsigned long long target, bool draw, uint32_t x) {
    unsigned long long local = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) local += weight(e);
    unsigned long long block_total;
    unsigned long long excl = block_scan<CD_THREADS>(local, &block_total);
    if (threadIdx.x < gridDim.x) cd_remote(cl, sh, threadIdx.x)->part[use][blockIdx.x] = block_total;
    cl.sync();
    unsigned long long before = 0, all = 0;
#pragma unroll
    for (int b = 0; b < CD_MAX_BLOCKS; ++b) {
        unsigned long long v = b < (int)gridDim.x ? sh->part[use][b] : 0ull;
        all += v;
        if (b < (int)blockIdx.x) before += v;
    }
    if (draw) target = __umul64hi(all, (unsigned long long)x << 32);
    return find_in_thread<E>(base, weight, before + excl, local, target);
}

// The cut of one selection over the ids base_play admits: the first (R, id), ascending, at which
// the running count (or mass) reaches want (with p32, ceil(total mass * p32 / 2^32)).
template <int E, typename BasePlay>
__device__ Cut cd_select(cg::cluster_group &cl, ClusterShared *sh, int &level_no, int use, int base,
                         const unsigned long long (&r)[E], const unsigned long long (&q)[E], BasePlay base_play,
                         bool by_mass, unsigned long long want, uint64_t p32) {
    unsigned long long prefix = 0;
    for (int level = 0; level < CD_LEVELS; ++level) {
        const int hi = cd_shift(level) + cd_width(level);
        Pick pk = cd_level<E>(
            cl, sh, level_no++, level, r, q,
            [&](int e) { return base_play(e) && (level == 0 || (r[e] >> hi) == (prefix >> hi)); }, by_mass, want,
            level == 0 ? p32 : 0);
        if (level == 0 && p32) want = pk.want;
        want -= pk.above;
        const int shift = cd_shift(level);
        prefix |= (unsigned long long)pk.digit << shift;
        // One id, or the whole bucket needed: the cut is the bucket's end.
        if (pk.count == 1 || want == (by_mass ? pk.mass : (unsigned long long)pk.count))
            return Cut{prefix | ((1ull << shift) - 1), INT_MAX};
        auto in_cell = [&](int e) { return base_play(e) && (r[e] >> shift) == (prefix >> shift); };
        if (pk.count <= CD_LIST) {
            // Every block gets the cell's ids and finds the same cut among them.
            if (threadIdx.x == 0) sh->list_mine = 0;
            __syncthreads();
#pragma unroll
            for (int e = 0; e < E; ++e) {
                if (in_cell(e)) {
                    uint32_t slot = atomicAdd(&sh->list_mine, 1u);
                    for (int b = 0; b < (int)gridDim.x; ++b) {
                        ClusterShared *o = cd_remote(cl, sh, b);
                        o->list_r[blockIdx.x][slot] = r[e];
                        o->list_q[blockIdx.x][slot] = q[e];
                        o->list_id[blockIdx.x][slot] = base + e;
                    }
                }
            }
            __syncthreads();
            if (threadIdx.x < gridDim.x) cd_remote(cl, sh, threadIdx.x)->list_n[blockIdx.x] = sh->list_mine;
            cl.sync();
            // Thread i takes the list's i-th entry, counted block by block.
            int i = threadIdx.x, b = 0;
            while (b < (int)gridDim.x && i >= (int)sh->list_n[b]) i -= sh->list_n[b++];
            if (b < (int)gridDim.x) {
                unsigned long long ri = sh->list_r[b][i], wi = by_mass ? sh->list_q[b][i] : 1ull, pre = 0;
                int32_t idi = sh->list_id[b][i];
                for (int bb = 0; bb < (int)gridDim.x; ++bb) {
                    for (int j = 0; j < (int)sh->list_n[bb]; ++j) {
                        unsigned long long rj = sh->list_r[bb][j];
                        int32_t idj = sh->list_id[bb][j];
                        if (rj < ri || (rj == ri && idj < idi)) pre += by_mass ? sh->list_q[bb][j] : 1ull;
                    }
                }
                if (pre < want && want <= pre + wi) {
                    sh->cut_r = ri;
                    sh->cut_id = idi;
                }
            }
            __syncthreads();
            Cut cut{sh->cut_r, sh->cut_id};
            __syncthreads();
            return cut;
        }
    }
    // Every bit of R is fixed and the cell is larger than the list: its ids are tied, so the cut
    // is by ascending id.
    const int found = cd_ordered_find<E>(
        cl, sh, use, base,
        [&](int e) { return base_play(e) && r[e] == prefix ? (by_mass ? q[e] : 1ull) : 0ull; }, want - 1, false, 0);
    if (found >= 0)
        for (int b = 0; b < (int)gridDim.x; ++b) cd_remote(cl, sh, b)->found[use] = found;
    cl.sync();
    return Cut{prefix, sh->found[use]};
}
#endif

template <int E, bool COMMIT>
__global__ void __launch_bounds__(CD_THREADS, 1)
    draw_cluster_kernel(const float *__restrict__ logits, int n, DrawParams p, CommitArgs c, int32_t *out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) unsigned char cd_smem[];
    ClusterShared *sh = reinterpret_cast<ClusterShared *>(cd_smem);
    cg::cluster_group cl = cg::this_cluster();
    const int blocks = gridDim.x;
    // Nothing before the wait, not even this block's own shared memory: with the zeroing before it
    // and the logits read through L1, sampled sequences on the loop differed from the host path's
    // now and then (H200; either change alone made them agree).
    pdl_wait();  // the logits and the loop's state come from the kernels before
    for (int i = threadIdx.x; i < 3 * CD_SLICE; i += CD_THREADS) (&sh->g_count[0][0])[i] = 0;
    for (int i = threadIdx.x; i < 9 * CD_SLICE; i += CD_THREADS) (&sh->g_part[0][0][0])[i] = 0;
    if (threadIdx.x < 3 * CD_MAX_BLOCKS) (&sh->t_count[0][0])[threadIdx.x] = 0;
    if (threadIdx.x < 9 * CD_MAX_BLOCKS) (&sh->t_part[0][0][0])[threadIdx.x] = 0;
    if (COMMIT) params_from_state(c.st, &p);
    const int base = (blockIdx.x * CD_THREADS + threadIdx.x) * E;
    float l[E];
    uint32_t key[E];
    uint32_t low;
    uint32_t kmax = load_keys<E>(logits, n, base, l, key, low);
    if (threadIdx.x % 32 == 0) {
        sh->warp_max[threadIdx.x / 32] = kmax;
        sh->warp_low[threadIdx.x / 32] = low;
    }
    __syncthreads();
    if (threadIdx.x < blocks) {
#pragma unroll
        for (int w = 0; w < CD_WARPS; ++w) {
            kmax = max(kmax, sh->warp_max[w]);
            low = max(low, sh->warp_low[w]);
        }
        cd_remote(cl, sh, threadIdx.x)->block_max[blockIdx.x] = kmax;
        cd_remote(cl, sh, threadIdx.x)->block_low[blockIdx.x] = low;
    }
    cl.sync();
    kmax = 0;
    low = 0;
#pragma unroll
    for (int b = 0; b < CD_MAX_BLOCKS; ++b) {
        kmax = max(kmax, b < blocks ? sh->block_max[b] : 0u);
        low = max(low, b < blocks ? sh->block_low[b] : 0u);
    }
    const float m = key_value(kmax);
    if (nonfinite(m)) {
        // NaN anywhere, +inf, or nothing but -inf: the forward broke; the commit latches it.
        if (blockIdx.x == 0 && threadIdx.x == 0) publish<COMMIT>(c, p, out, -1, kmax, ~kmax ^ 1u);
        return;
    }
    unsigned long long r[E], q[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        float x = __fmul_rn(__fsub_rn(l[e], m), p.inv_t);
        uint32_t f = (uint32_t)fminf(__fmul_rn(-x, 0x1p17f), 4194303.0f);
        r[e] = base + e < n ? ((unsigned long long)f << 32) | (uint32_t)~key[e] : ~0ull;
        q[e] = base + e < n ? __float2ull_rn(__fmul_rn(exp32(x), 0x1p40f)) : 0ull;
    }
    auto valid = [&](int e) { return base + e < n; };
    int level_no = 0;

    // Top-k: the first top_k ids in candidate order.
    const bool k_on = p.top_k > 0 && p.top_k < n;
    Cut k_cut{~0ull, INT_MAX};
    if (k_on) k_cut = cd_select<E>(cl, sh, level_no, 0, base, r, q, valid, false, (unsigned long long)p.top_k, 0);
    auto kept_k = [&](int e) {
        return valid(e) && (r[e] < k_cut.r || (r[e] == k_cut.r && base + e <= k_cut.id));
    };
    // Top-p over the top-k set: the shortest prefix of it holding ceil(S * p32 / 2^32).
    Cut p_cut{~0ull, INT_MAX};
    if (p.p32 < (1ull << 32)) p_cut = cd_select<E>(cl, sh, level_no, 1, base, r, q, kept_k, true, 0, p.p32);

    // The draw, in ascending id order over what is kept.
    const uint32_t x = philox_word0((uint64_t)p.position, p.seed);
    const int tok = cd_ordered_find<E>(
        cl, sh, 2, base,
        [&](int e) { return kept_k(e) && (r[e] < p_cut.r || (r[e] == p_cut.r && base + e <= p_cut.id)) ? q[e] : 0ull; },
        0, true, x);
    if (tok >= 0) publish<COMMIT>(c, p, out, tok, kmax, low);
#endif
}

// The blocks of the cluster draw_cluster_kernel<E, COMMIT> runs in on this device: 16 where the
// device schedules such a cluster, else 8; 0 below compute capability 9.0 or where neither fits.
template <int E, bool COMMIT>
static int cluster_blocks(arc_context *ctx, int *blocks) {
    *blocks = 0;
    if (ctx->cc_major < 9) return ARC_OK;
    auto kernel = draw_cluster_kernel<E, COMMIT>;
    ARC_CUDA(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    const int smem = (int)sizeof(ClusterShared);
    ARC_CUDA(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    for (int size = CD_MAX_BLOCKS; size >= CD_MIN_BLOCKS; size /= 2) {
        cudaLaunchAttribute attr;
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = size;
        attr.val.clusterDim.y = 1;
        attr.val.clusterDim.z = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(size);
        cfg.blockDim = dim3(CD_THREADS);
        cfg.dynamicSmemBytes = sizeof(ClusterShared);
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        int clusters = 0;
        ARC_CUDA(ctx, cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
        if (clusters > 0) {
            *blocks = size;
            return ARC_OK;
        }
    }
    return ARC_OK;
}

int arc_draw_init(arc_context *ctx) {
    int(*const find[4])(arc_context *, int *) = {cluster_blocks<4, false>, cluster_blocks<4, true>,
                                                 cluster_blocks<8, false>, cluster_blocks<8, true>};
    for (int i = 0; i < 4; ++i) ARC_TRY(find[i](ctx, &ctx->draw_cluster[i / 2][i % 2]));
    return ARC_OK;
}

template <int E, bool COMMIT>
static int try_cluster(arc_context *ctx, const DrawJob &d, bool *launched) {
    const int blocks = ctx->draw_cluster[E == 4 ? 0 : 1][COMMIT ? 1 : 0];
    *launched = blocks > 0 && d.n <= blocks * CD_THREADS * E;
    if (!*launched) return ARC_OK;
    return arc_launch_ex(ctx, COMMIT ? "draw_cluster_commit_kernel" : "draw_cluster_kernel",
                         draw_cluster_kernel<E, COMMIT>, dim3(blocks), dim3(CD_THREADS), sizeof(ClusterShared), blocks,
                         d.logits, d.n, d.p, d.c, d.out);
}

int try_draw_cluster(arc_context *ctx, const DrawJob &d, bool commit, bool *launched) {
    int st = commit ? try_cluster<4, true>(ctx, d, launched) : try_cluster<4, false>(ctx, d, launched);
    if (st == ARC_OK && !*launched)
        st = commit ? try_cluster<8, true>(ctx, d, launched) : try_cluster<8, false>(ctx, d, launched);
    return st;
}
