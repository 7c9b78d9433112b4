// comm.cu -- the all-reduce of tensor parallelism: NCCL, loaded when first asked for (dlopen), so
// that libarc.so needs no NCCL to load and a machine without one gets an error, not a failed link.
// A communicator is one rank's, held by its context: `world` processes (or threads) join with one
// unique id, or one process creates every rank's at once; each rank's all-reduce is enqueued on its
// context's stream like any other step work, so it is captured into the step graph and replayed
// with no host in between. A model on a context with a communicator is that rank's shard.
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>

#include "internal.cuh"

// NCCL's C ABI, as far as this file uses it (nccl.h's types: an opaque communicator, int enums).
typedef struct ncclComm *ncclComm_t;
enum { NCCL_SUCCESS = 0, NCCL_FLOAT32 = 7, NCCL_SUM = 0, NCCL_UNIQUE_ID_BYTES = 128 };
struct NcclId {
    char internal[NCCL_UNIQUE_ID_BYTES];
};
static_assert(sizeof(NcclId) == ARC_COMM_ID_BYTES, "arc.h's id size is NCCL's");

struct NcclApi {
    void *handle;
    int (*get_unique_id)(NcclId *);
    int (*comm_init_rank)(ncclComm_t *, int, NcclId, int);
    int (*comm_destroy)(ncclComm_t);
    int (*all_reduce)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
    const char *(*error_string)(int);
    int (*get_version)(int *);
    int (*comm_init_all)(ncclComm_t *, int, const int *);
    int (*group_start)(void);
    int (*group_end)(void);
};

struct arc_comm {
    arc_context *ctx;
    const NcclApi *api;
    ncclComm_t comm;
    int world, rank;
};

// NCCL, once loaded, stays loaded for the life of the process: ncclGetUniqueId leaves a thread
// running in it (the root of the ranks' bootstrap), which an unloaded library would pull the code from under.
static std::mutex nccl_lock;
static NcclApi nccl_loaded;
static char nccl_name[4096];

// The library at `path` (null: "libnccl.so.2" where the dynamic loader finds it), its entry points.
static int nccl_open(const char *name, NcclApi *api, const char *who) {
    memset(api, 0, sizeof(*api));
    api->handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!api->handle) return arc_fail(ARC_NO_DEVICE, who, "cannot load NCCL from %s: %s", name, dlerror());
    struct {
        void **slot;
        const char *symbol;
    } entries[] = {{(void **)&api->get_unique_id, "ncclGetUniqueId"}, {(void **)&api->comm_init_rank, "ncclCommInitRank"},
                   {(void **)&api->comm_destroy, "ncclCommDestroy"}, {(void **)&api->all_reduce, "ncclAllReduce"},
                   {(void **)&api->error_string, "ncclGetErrorString"}, {(void **)&api->get_version, "ncclGetVersion"},
                   {(void **)&api->comm_init_all, "ncclCommInitAll"}, {(void **)&api->group_start, "ncclGroupStart"},
                   {(void **)&api->group_end, "ncclGroupEnd"}};
    for (auto &e : entries) {
        *e.slot = dlsym(api->handle, e.symbol);
        if (!*e.slot) {
            dlclose(api->handle);
            api->handle = nullptr;
            return arc_fail(ARC_NO_DEVICE, who, "%s has no %s: not an NCCL library", name, e.symbol);
        }
    }
    return ARC_OK;
}

// The process's NCCL: loaded from `path` the first time, the same library every time after.
static int nccl_load(const char *path, const NcclApi **api, const char *who) {
    std::lock_guard<std::mutex> hold(nccl_lock);
    const char *name = path ? path : "libnccl.so.2";
    if (!nccl_loaded.handle) {
        if (strlen(name) >= sizeof(nccl_name)) return arc_fail(ARC_INVALID_ARGUMENT, who, "NCCL's path is too long");
        NcclApi fresh;
        const int status = nccl_open(name, &fresh, who);
        if (status != ARC_OK) return status;
        nccl_loaded = fresh;
        strcpy(nccl_name, name);
    } else if (strcmp(name, nccl_name) != 0) {
        return arc_fail(ARC_INVALID_ARGUMENT, who, "NCCL is loaded from %s already, not %s", nccl_name, name);
    }
    *api = &nccl_loaded;
    return ARC_OK;
}

static int nccl_failed(const NcclApi &api, int result, const char *call, const char *who) {
    return arc_fail(ARC_CUDA_ERROR, who, "%s failed: %s (NCCL error %d)", call, api.error_string(result), result);
}

extern "C" int arc_comm_unique_id(const char *library, uint8_t *id) {
    ARC_REQUIRE(id, "id is null");
    const NcclApi *api = nullptr;
    const int loaded = nccl_load(library, &api, __func__);
    if (loaded != ARC_OK) return loaded;
    NcclId nid;
    const int r = api->get_unique_id(&nid);
    if (r != NCCL_SUCCESS) return nccl_failed(*api, r, "ncclGetUniqueId", __func__);
    memcpy(id, nid.internal, sizeof(nid.internal));
    return ARC_OK;
}

extern "C" int arc_comm_create(arc_context *ctx, const char *library, const uint8_t *id, int32_t world, int32_t rank,
                               arc_comm **out) {
    ARC_REQUIRE(ctx && id && out, "null argument");
    ARC_REQUIRE(world >= 1 && world <= ARC_MAX_WORLD && rank >= 0 && rank < world,
                "rank %d of world %d: a world holds 1 to %d ranks", rank, world, ARC_MAX_WORLD);
    ARC_REQUIRE(!ctx->capturing, "not while a graph is being captured");
    ARC_REQUIRE(!ctx->comm, "the context already holds a rank's communicator");
    *out = nullptr;
    arc_comm *c = (arc_comm *)calloc(1, sizeof(arc_comm));
    ARC_REQUIRE(c, "out of host memory");
    int status = nccl_load(library, &c->api, __func__);
    if (status == ARC_OK) {
        const cudaError_t err = cudaSetDevice(ctx->device);
        status = err == cudaSuccess ? ARC_OK : arc_fail_cuda(err, "cudaSetDevice", __func__);
    }
    if (status == ARC_OK) {  // blocks until every rank has joined: at load, never per step
        NcclId nid;
        memcpy(nid.internal, id, sizeof(nid.internal));
        const int r = c->api->comm_init_rank(&c->comm, world, nid, rank);
        if (r != NCCL_SUCCESS) status = nccl_failed(*c->api, r, "ncclCommInitRank", __func__);
    }
    if (status != ARC_OK) {
        free(c);
        return status;
    }
    c->ctx = ctx;
    c->world = world;
    c->rank = rank;
    ctx->comm = c;
    *out = c;
    return ARC_OK;
}

extern "C" int arc_comm_create_all(arc_context *const *ctxs, int32_t world, const char *library, arc_comm **out) {
    ARC_REQUIRE(ctxs && out, "null argument");
    ARC_REQUIRE(world >= 1 && world <= ARC_MAX_WORLD, "a world holds 1 to %d ranks, got %d", ARC_MAX_WORLD, world);
    int devices[ARC_MAX_WORLD];
    for (int r = 0; r < world; ++r) {
        ARC_REQUIRE(ctxs[r], "context %d is null", r);
        ARC_REQUIRE(!ctxs[r]->capturing && !ctxs[r]->comm, "context %d is capturing or holds a communicator", r);
        devices[r] = ctxs[r]->device;
        out[r] = nullptr;
    }
    arc_comm *c[ARC_MAX_WORLD] = {};
    ncclComm_t comms[ARC_MAX_WORLD] = {};
    const NcclApi *nccl = nullptr;
    int status = nccl_load(library, &nccl, __func__);
    for (int r = 0; r < world && status == ARC_OK; ++r) {
        c[r] = (arc_comm *)calloc(1, sizeof(arc_comm));
        if (!c[r]) status = arc_fail(ARC_INVALID_ARGUMENT, __func__, "out of host memory");
    }
    if (status == ARC_OK) {
        const int r = nccl->comm_init_all(comms, world, devices);
        if (r != NCCL_SUCCESS) status = nccl_failed(*nccl, r, "ncclCommInitAll", __func__);
    }
    float *one[ARC_MAX_WORLD] = {};
    if (status == ARC_OK) {  // one all-reduce of every rank together: the ranks connect in it, at load,
        const NcclApi &api = *nccl;  // not in the first capture (which cannot wait for its peers)
        for (int r = 0; r < world && status == ARC_OK; ++r) {
            cudaError_t err = cudaSetDevice(devices[r]);
            if (err == cudaSuccess) err = cudaMallocAsync((void **)&one[r], sizeof(float), ctxs[r]->stream);
            if (err == cudaSuccess) err = cudaMemsetAsync(one[r], 0, sizeof(float), ctxs[r]->stream);
            if (err != cudaSuccess) status = arc_fail_cuda(err, "cudaMallocAsync", __func__);
        }
        int res = status == ARC_OK ? api.group_start() : NCCL_SUCCESS;
        for (int r = 0; r < world && status == ARC_OK && res == NCCL_SUCCESS; ++r)
            res = api.all_reduce(one[r], one[r], 1, NCCL_FLOAT32, NCCL_SUM, comms[r], ctxs[r]->stream);
        if (status == ARC_OK) {
            const int end = api.group_end();
            if (res == NCCL_SUCCESS) res = end;
            if (res != NCCL_SUCCESS) status = nccl_failed(api, res, "ncclAllReduce (the ranks' first)", __func__);
        }
        for (int r = 0; r < world; ++r)  // freed in stream order, after each rank's sum
            if (one[r]) {
                const cudaError_t err = cudaFreeAsync(one[r], ctxs[r]->stream);
                if (err != cudaSuccess && status == ARC_OK) status = arc_fail_cuda(err, "cudaFreeAsync", __func__);
            }
    }
    for (int r = 0; r < world; ++r) {
        if (!c[r]) continue;
        if (status != ARC_OK) {
            if (comms[r]) nccl->comm_destroy(comms[r]);
            free(c[r]);
            continue;
        }
        c[r]->ctx = ctxs[r];
        c[r]->api = nccl;
        c[r]->comm = comms[r];
        c[r]->world = world;
        c[r]->rank = r;
        ctxs[r]->comm = c[r];
        out[r] = c[r];
    }
    return status;
}

int comm_rank(const arc_context *ctx) { return ctx->comm ? ctx->comm->rank : 0; }

int comm_sum(arc_context *ctx, float *x, int64_t n) {
    return ctx->comm ? arc_comm_all_reduce(ctx->comm, x, x, n) : ARC_OK;
}

extern "C" int arc_comm_destroy(arc_comm *comm) {
    if (!comm) return ARC_OK;
    if (comm->ctx->comm == comm) comm->ctx->comm = nullptr;
    const int r = comm->api->comm_destroy(comm->comm);
    const int status = r == NCCL_SUCCESS ? ARC_OK : nccl_failed(*comm->api, r, "ncclCommDestroy", __func__);
    free(comm);
    return status;
}

extern "C" int arc_comm_all_reduce(arc_comm *comm, const float *send, float *recv, int64_t count) {
    ARC_REQUIRE(comm && send && recv, "null argument");
    ARC_REQUIRE(count >= 1, "count must be at least 1, got %lld", (long long)count);
    arc_context *ctx = comm->ctx;
    const int r = comm->api->all_reduce(send, recv, (size_t)count, NCCL_FLOAT32, NCCL_SUM, comm->comm, ctx->stream);
    if (r != NCCL_SUCCESS) return nccl_failed(*comm->api, r, "ncclAllReduce", __func__);
    ARC_CUDA(ctx, cudaGetLastError());
    return ARC_OK;
}

extern "C" int arc_comm_info(arc_comm *comm, int32_t *world, int32_t *rank, int32_t *nccl_version) {
    ARC_REQUIRE(comm && world && rank && nccl_version, "null argument");
    *world = comm->world;
    *rank = comm->rank;
    return comm->api->get_version(nccl_version) == NCCL_SUCCESS ? ARC_OK
                                                               : arc_fail(ARC_CUDA_ERROR, __func__, "ncclGetVersion failed");
}
