/* fake_nccl.c - a small stand-in for libnccl.so.2, built by the tests (soname libnccl.so.2).
 *
 * It exports the communicator API the preload hooks interpose, checks arguments the way NCCL does
 * (magic of ncclConfig_t, rank range), and, like NCCL, loads NCCL_PROFILER_PLUGIN and calls its
 * v5 init from inside comm init and startEvent/stopEvent per collective, so the tests can check
 * that a profiler init is joined to the hook whose real call it ran inside.
 * -DFAKE_SIMULATED also exports `ncclSimulated`, the marker of the simulated NCCL. -DFAKE_NO_GETENV
 * reads no variable at comm init: a test racing setenv/unsetenv against the probe's environment walk
 * then races only the probe (glibc's own getenv re-reads entries too, and may crash on such a host). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_abi.h"

#define EXPORT __attribute__((visibility("default")))

struct ncclComm {
  int rank, nranks, dev;
  uint64_t hash;
  void* prof_ctx;
  char proto[16];
};

#ifdef FAKE_SIMULATED
EXPORT int ncclSimulated = 1;
#endif

static ncclProfiler_v5_t* prof;
static int prof_mask;

static void open_profiler(void) {
#ifdef FAKE_NO_GETENV
  const char* path = NULL; /* reads no variable at all (its first comm init raced the host's setenv) */
#else
  const char* path = getenv("NCCL_PROFILER_PLUGIN");
#endif
  if (!path || !*path) return;
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL); /* as src/plugin/plugin_open.cc does */
  if (h) prof = (ncclProfiler_v5_t*)dlsym(h, "ncclProfiler_v5");
}

/* Once, and every thread waits for it: a thread that saw "tried" before the plugin was open would
 * make its communicator without the plugin (NCCL guards its plugin load with a mutex too). */
static void load_profiler(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, open_profiler);
}

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {}

EXPORT ncclResult_t ncclGetVersion(int* v) {
  *v = FAKE_VERSION;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "fake-%d", rand());
  return ncclSuccess;
}

static ncclResult_t make(ncclComm_t* out, int nranks, int rank, uint64_t hash, const char* name) {
  if (!out || nranks <= 0 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  struct ncclComm* c = calloc(1, sizeof *c);
  c->rank = rank;
  c->nranks = nranks;
  c->dev = rank % 8;
  c->hash = hash;
  /* NCCL_PROTO is read again at every comm init (src/graph/tuning.cc). */
#ifdef FAKE_NO_GETENV
  const char* p = NULL;
#else
  const char* p = getenv("NCCL_PROTO");
#endif
  snprintf(c->proto, sizeof c->proto, "%s", p && *p ? p : "Simple");
  load_profiler();
  if (prof) prof->init(&c->prof_ctx, hash, &prof_mask, name, 1, nranks, rank, logger);
  *out = c;
  return ncclSuccess;
}

static uint64_t hash_id(const ncclUniqueId* id) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) h = (h ^ (unsigned char)id->internal[i]) * 1099511628211ull;
  return h;
}

static ncclResult_t check_config(const ncclConfig_t* cfg, const char** name) {
  *name = NULL;
  if (!cfg) return ncclSuccess;
  if (cfg->magic != NCCL_API_MAGIC) return ncclInvalidArgument;
  if (cfg->size >= offsetof(ncclConfig_t, commName) + sizeof(char*) && cfg->version >= NCCL_ABI_VERSION(2, 27, 0))
    *name = cfg->commName;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return make(comm, nranks, rank, hash_id(&id), NULL);
}

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                           ncclConfig_t* config) {
  const char* name;
  ncclResult_t rc = check_config(config, &name);
  return rc != ncclSuccess ? rc : make(comm, nranks, rank, hash_id(&id), name);
}

EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (ndev <= 0) return ncclInvalidArgument;
  for (int i = 0; i < ndev; i++) {
    ncclResult_t rc = make(&comms[i], ndev, i, 0xa11u, NULL);
    if (rc != ncclSuccess) return rc;
    if (devlist) comms[i]->dev = devlist[i];
  }
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int nId, ncclUniqueId* ids,
                                             ncclConfig_t* config) {
  const char* name;
  ncclResult_t rc = check_config(config, &name);
  if (rc != ncclSuccess || nId <= 0) return rc != ncclSuccess ? rc : ncclInvalidArgument;
  return make(comm, nranks, rank, hash_id(&ids[0]), name);
}

EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  const char* name;
  ncclResult_t rc = check_config(config, &name);
  if (rc != ncclSuccess || !comm) return rc != ncclSuccess ? rc : ncclInvalidArgument;
  if (color == NCCL_SPLIT_NOCOLOR) {
    *newcomm = NULL;
    return ncclSuccess;
  }
  /* Every rank gets its own single-rank communicator: enough to exercise the hook. */
  return make(newcomm, 1, 0, comm->hash * 31 + (uint64_t)color, name);
}

EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* excl, int nexcl, ncclComm_t* newcomm, ncclConfig_t* config,
                                   int flags) {
  const char* name;
  ncclResult_t rc = check_config(config, &name);
  if (rc != ncclSuccess || !comm || nexcl >= comm->nranks) return rc != ncclSuccess ? rc : ncclInvalidArgument;
  return make(newcomm, comm->nranks - nexcl, 0, comm->hash * 37, name);
}

EXPORT ncclResult_t ncclCommGrow(ncclComm_t comm, int nranks, const ncclUniqueId* id, int rank, ncclComm_t* newcomm,
                                 ncclConfig_t* config) {
  const char* name;
  ncclResult_t rc = check_config(config, &name);
  if (rc != ncclSuccess) return rc;
  return make(newcomm, nranks, rank >= 0 ? rank : (comm ? comm->rank : 0), id ? hash_id(id) : 7, name);
}

static ncclResult_t end(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  if (prof && comm->prof_ctx) prof->finalize(comm->prof_ctx);
  free(comm);
  return ncclSuccess;
}
EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) { return end(comm); }
EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) { return end(comm); }
EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) { return comm ? ncclSuccess : ncclInvalidArgument; }

EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* r) { *r = comm->rank; return ncclSuccess; }
EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* n) { *n = comm->nranks; return ncclSuccess; }
EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* d) { *d = comm->dev; return ncclSuccess; }

/* One collective event per call, as src/plugin/profiler.cc ncclProfilerStartTaskEvents fills it. */
EXPORT ncclResult_t ncclAllReduce(const void* s, void* r, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                                  ncclComm_t comm, void* stream) {
  if (!comm) return ncclInvalidArgument;
  if (prof && comm->prof_ctx && (prof_mask & ncclProfileColl) && comm->nranks > 1) {
    ncclProfilerEventDescr_v5_t d;
    memset(&d, 0, sizeof d);
    d.type = ncclProfileColl;
    d.rank = comm->rank;
    d.coll.func = "AllReduce";
    d.coll.sendBuff = s;
    d.coll.recvBuff = r;
    d.coll.count = count;
    d.coll.datatype = dt == ncclFloat32 ? "ncclFloat32" : "ncclInt8";
    d.coll.nChannels = 2;
    d.coll.nWarps = 16;
    d.coll.algo = "Ring";
    d.coll.proto = comm->proto;
    void* h = NULL;
    prof->startEvent(comm->prof_ctx, &h, &d);
    if (h) prof->stopEvent(h);
  }
  return ncclSuccess;
}
