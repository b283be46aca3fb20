/* simtorch.c - a stand-in for PyTorch's ProcessGroupNCCL: a library linked against libnccl.so.2
 * (NEEDED, like libtorch_cuda.so), so its NCCL calls go through the dynamic linker and an
 * LD_PRELOAD hook sees them. Python workers call these functions through ctypes; the calls into
 * NCCL are made here, the way PyTorch's NCCLComm::create / split / allreduce make them.
 * Ints below 0 and NULL strings mean "not set" (NCCL_CONFIG_INITIALIZER's INT_MIN / NULL).
 */
#include <string.h>

#include "../include/nccl_abi.h"

#define EXPORT __attribute__((visibility("default")))

/* NCCL's API, declared here as nccl.h would (nccl_abi.h carries the types only) */
ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, void* stream);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
const char* ncclGetErrorString(ncclResult_t result);
/* the simulated CUDA runtime the sim libnccl exports (probes/simnccl/graph.c) */
ncclResult_t ncclprobeSimStreamBeginCapture(void* stream);
ncclResult_t ncclprobeSimStreamEndCapture(void* stream, void** graph);
ncclResult_t ncclprobeSimGraphLaunch(void* graph);
ncclResult_t ncclprobeSimGraphDestroy(void* graph);
ncclResult_t ncclprobeSimSynchronize(void);

/* the caller's compile-time view: nccl.h of 2.28 (ncclConfig_v22800, 80 bytes) */
#define SIMTORCH_NCCL_VERSION NCCL_ABI_VERSION(2, 28, 9)
#define SIMTORCH_CONFIG_SIZE 80

EXPORT int simtorch_nccl_version(int* version) { return ncclGetVersion(version); }

EXPORT int simtorch_get_unique_id(unsigned char* out128) {
  if (!out128) return ncclInvalidArgument;
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r == ncclSuccess) memcpy(out128, id.internal, NCCL_UNIQUE_ID_BYTES);
  return r;
}

static ncclUniqueId toId(const unsigned char* in128) {
  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  if (in128) memcpy(id.internal, in128, NCCL_UNIQUE_ID_BYTES);
  return id;
}

/* NCCLComm::create(numRanks, rank, commId) without options: ncclCommInitRank */
EXPORT int simtorch_init_rank(void** comm, int nranks, const unsigned char* id128, int rank) {
  if (!id128) return ncclInvalidArgument;
  return ncclCommInitRank((ncclComm_t*)comm, nranks, toId(id128), rank);
}

/* NCCLComm::create(..., config): ncclCommInitRankConfig, PyTorch's path whenever NCCL >= 2.17 */
EXPORT int simtorch_init_rank_config(void** comm, int nranks, const unsigned char* id128, int rank, int blocking,
                                     int min_ctas, int max_ctas, const char* comm_name) {
  if (!id128) return ncclInvalidArgument;
  ncclConfig_t config;
  memset(&config, 0, sizeof(config));
  config.size = SIMTORCH_CONFIG_SIZE;
  config.magic = NCCL_API_MAGIC;
  config.version = SIMTORCH_NCCL_VERSION;
#define UNSET_INT(f) config.f = NCCL_CONFIG_UNDEF_INT;
#define UNSET_STR(f) config.f = NULL;
#define X(f, kind, since) UNSET_##kind(f)
  NCCL_ABI_CONFIG_FIELDS(X)
#undef X
  if (blocking >= 0) config.blocking = blocking;
  if (min_ctas >= 0) config.minCTAs = min_ctas;
  if (max_ctas >= 0) config.maxCTAs = max_ctas;
  config.commName = comm_name;
  return ncclCommInitRankConfig((ncclComm_t*)comm, nranks, toId(id128), rank, &config);
}

/* NCCLComm::split: ncclCommSplit with the parent's config (NULL) */
EXPORT int simtorch_split(void* comm, int color, int key, void** newcomm) {
  return ncclCommSplit((ncclComm_t)comm, color, key, (ncclComm_t*)newcomm, NULL);
}

/* The calling thread's current stream: the default (NULL) one, or while it captures a graph the
 * side stream torch.cuda.graph captures on (one per thread, as each thread has its own). */
static __thread char captureStream;
static __thread void* currentStream;

EXPORT int simtorch_all_reduce(void* comm, const void* sendbuf, void* recvbuf, size_t count, int datatype, int op) {
  return ncclAllReduce(sendbuf, recvbuf, count, (ncclDataType_t)datatype, (ncclRedOp_t)op, (ncclComm_t)comm,
                       currentStream);
}

/* torch.cuda.graph(g): capture begins on a side stream; collectives issued meanwhile are recorded */
EXPORT int simtorch_graph_capture_begin(void) {
  if (currentStream) return ncclInvalidUsage;
  ncclResult_t r = ncclprobeSimStreamBeginCapture(&captureStream);
  if (r == ncclSuccess) currentStream = &captureStream;
  return r;
}

EXPORT int simtorch_graph_capture_end(void** graph) {
  if (!currentStream) return ncclInvalidUsage;
  ncclResult_t r = ncclprobeSimStreamEndCapture(currentStream, graph);
  currentStream = NULL;
  return r;
}

EXPORT int simtorch_graph_replay(void* graph) { return ncclprobeSimGraphLaunch(graph); }
EXPORT int simtorch_graph_destroy(void* graph) { return ncclprobeSimGraphDestroy(graph); }
EXPORT int simtorch_synchronize(void) { return ncclprobeSimSynchronize(); }

EXPORT int simtorch_comm_info(void* comm, int* rank, int* nranks, int* device) {
  ncclResult_t r = ncclCommUserRank((ncclComm_t)comm, rank);
  if (r == ncclSuccess) r = ncclCommCount((ncclComm_t)comm, nranks);
  if (r == ncclSuccess) r = ncclCommCuDevice((ncclComm_t)comm, device);
  return r;
}

EXPORT int simtorch_finalize(void* comm) { return ncclCommFinalize((ncclComm_t)comm); }
EXPORT int simtorch_destroy(void* comm) { return ncclCommDestroy((ncclComm_t)comm); }
EXPORT int simtorch_abort(void* comm) { return ncclCommAbort((ncclComm_t)comm); }
EXPORT const char* simtorch_error_string(int code) { return ncclGetErrorString((ncclResult_t)code); }
