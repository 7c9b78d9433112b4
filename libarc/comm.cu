// comm.cu -- the all-reduce of tensor parallelism: NCCL, loaded when first asked for (dlopen), so
// that libarc.so needs no NCCL to load and a machine without one gets an error, not a failed link.
// A communicator is one rank's: `world` processes (or contexts) join with one unique id, and each
// rank's all-reduce is enqueued on its context's stream like any other step work, so it can be
// captured into the step graph and replayed with no host in between.
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

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
};

struct arc_comm {
    arc_context *ctx;
    NcclApi api;
    ncclComm_t comm;
    int world, rank;
};

// The library at `path` (null: "libnccl.so.2" where the dynamic loader finds it), its entry points.
static int nccl_load(const char *path, NcclApi *api, const char *who) {
    memset(api, 0, sizeof(*api));
    const char *name = path ? path : "libnccl.so.2";
    api->handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!api->handle) return arc_fail(ARC_NO_DEVICE, who, "cannot load NCCL from %s: %s", name, dlerror());
    struct {
        void **slot;
        const char *symbol;
    } entries[] = {{(void **)&api->get_unique_id, "ncclGetUniqueId"}, {(void **)&api->comm_init_rank, "ncclCommInitRank"},
                   {(void **)&api->comm_destroy, "ncclCommDestroy"}, {(void **)&api->all_reduce, "ncclAllReduce"},
                   {(void **)&api->error_string, "ncclGetErrorString"}, {(void **)&api->get_version, "ncclGetVersion"}};
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

static int nccl_failed(const NcclApi &api, int result, const char *call, const char *who) {
    return arc_fail(ARC_CUDA_ERROR, who, "%s failed: %s (NCCL error %d)", call, api.error_string(result), result);
}

extern "C" int arc_comm_unique_id(const char *library, uint8_t *id) {
    ARC_REQUIRE(id, "id is null");
    NcclApi api;
    const int loaded = nccl_load(library, &api, __func__);
    if (loaded != ARC_OK) return loaded;
    NcclId nid;
    const int r = api.get_unique_id(&nid);
    if (r == NCCL_SUCCESS) memcpy(id, nid.internal, sizeof(nid.internal));
    const int status = r == NCCL_SUCCESS ? ARC_OK : nccl_failed(api, r, "ncclGetUniqueId", __func__);
    dlclose(api.handle);
    return status;
}

extern "C" int arc_comm_create(arc_context *ctx, const char *library, const uint8_t *id, int32_t world, int32_t rank,
                               arc_comm **out) {
    ARC_REQUIRE(ctx && id && out, "null argument");
    ARC_REQUIRE(world >= 1 && world <= ARC_MAX_WORLD && rank >= 0 && rank < world,
                "rank %d of world %d: a world holds 1 to %d ranks", rank, world, ARC_MAX_WORLD);
    ARC_REQUIRE(!ctx->capturing, "not while a graph is being captured");
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
        const int r = c->api.comm_init_rank(&c->comm, world, nid, rank);
        if (r != NCCL_SUCCESS) status = nccl_failed(c->api, r, "ncclCommInitRank", __func__);
    }
    if (status != ARC_OK) {
        if (c->api.handle) dlclose(c->api.handle);
        free(c);
        return status;
    }
    c->ctx = ctx;
    c->world = world;
    c->rank = rank;
    *out = c;
    return ARC_OK;
}

extern "C" int arc_comm_destroy(arc_comm *comm) {
    if (!comm) return ARC_OK;
    const int r = comm->api.comm_destroy(comm->comm);
    const int status = r == NCCL_SUCCESS ? ARC_OK : nccl_failed(comm->api, r, "ncclCommDestroy", __func__);
    dlclose(comm->api.handle);
    free(comm);
    return status;
}

extern "C" int arc_comm_all_reduce(arc_comm *comm, float *buffer, int64_t count) {
    ARC_REQUIRE(comm && buffer, "null argument");
    ARC_REQUIRE(count >= 1, "count must be at least 1, got %lld", (long long)count);
    arc_context *ctx = comm->ctx;
    const int r = comm->api.all_reduce(buffer, buffer, (size_t)count, NCCL_FLOAT32, NCCL_SUM, comm->comm, ctx->stream);
    if (r != NCCL_SUCCESS) return nccl_failed(comm->api, r, "ncclAllReduce", __func__);
    ARC_CUDA(ctx, cudaGetLastError());
    return ARC_OK;
}

extern "C" int arc_comm_info(arc_comm *comm, int32_t *world, int32_t *rank, int32_t *nccl_version) {
    ARC_REQUIRE(comm && world && rank && nccl_version, "null argument");
    *world = comm->world;
    *rank = comm->rank;
    return comm->api.get_version(nccl_version) == NCCL_SUCCESS ? ARC_OK
                                                               : arc_fail(ARC_CUDA_ERROR, __func__, "ncclGetVersion failed");
}
