/* Test profiler plugin: ncclProfiler_v5 (or ncclProfiler_v4 with -DPROF_V4) writing one line per
 * init, collective event (start and stop) and finalize to $SIMTEST_PROF_LOG, and the NCCL_PROTO it
 * sees at init. Other events get another handle, whose stop is not logged. */
#include <stdio.h>
#include <stdlib.h>

#include "../../probes/include/nccl_abi.h"

typedef struct { uint64_t hash; int rank; } ctx_t;
static FILE* out;
static int handle; /* the collectives' */
static int other;  /* every other event's */

static void open_out(void) {
  if (!out) {
    const char* path = getenv("SIMTEST_PROF_LOG");
    out = path ? fopen(path, "a") : NULL;
    if (out) setvbuf(out, NULL, _IOLBF, 0);
  }
}

static ncclResult_t common_init(void** context, uint64_t hash, int* mask, const char* name, int nNodes, int nranks,
                                int rank, int version) {
  open_out();
  ctx_t* c = calloc(1, sizeof(*c));
  c->hash = hash;
  c->rank = rank;
  *context = c;
  *mask = ncclProfileColl;
  const char* proto = getenv("NCCL_PROTO");
  if (out) fprintf(out, "init v%d hash=0x%llx name=%s nnodes=%d nranks=%d rank=%d proto_env=%s\n", version,
                   (unsigned long long)hash, name ? name : "(null)", nNodes, nranks, rank, proto ? proto : "(unset)");
  return ncclSuccess;
}

#define LOG_COLL(c, d)                                                                                     \
  if (out)                                                                                                 \
    fprintf(out, "coll hash=0x%llx rank=%d seq=%llu func=%s algo=%s proto=%s nch=%d nwarps=%d count=%zu dt=%s\n", \
            (unsigned long long)(c)->hash, (d)->rank, (unsigned long long)(d)->coll.seqNumber, (d)->coll.func,     \
            (d)->coll.algo, (d)->coll.proto, (int)(d)->coll.nChannels, (int)(d)->coll.nWarps, (d)->coll.count,   \
            (d)->coll.datatype);

static ncclResult_t stopEvent(void* h) {
  if (out && h == &handle) fprintf(out, "stop\n");
  return ncclSuccess;
}
static ncclResult_t recordEventState(void* h, ncclProfilerEventState_t s, ncclProfilerEventStateArgs_v4_t* a) {
  return ncclSuccess;
}
static ncclResult_t finalize(void* context) {
  ctx_t* c = context;
  if (out && c) fprintf(out, "finalize hash=0x%llx rank=%d\n", (unsigned long long)c->hash, c->rank);
  free(c);
  return ncclSuccess;
}

#ifdef PROF_V4
static ncclResult_t init4(void** context, int* mask, const char* name, uint64_t hash, int nNodes, int nranks, int rank,
                          ncclDebugLogger_t logfn) {
  return common_init(context, hash, mask, name, nNodes, nranks, rank, 4);
}
static ncclResult_t start4(void* context, void** h, ncclProfilerEventDescr_v4_t* d) {
  if (d->type == ncclProfileColl) { LOG_COLL((ctx_t*)context, d) }
  *h = d->type == ncclProfileColl ? (void*)&handle : (void*)&other;
  return ncclSuccess;
}
__attribute__((visibility("default"))) ncclProfiler_v4_t ncclProfiler_v4 = {"simtest-prof4", init4, start4, stopEvent,
                                                                           recordEventState, finalize};
#else
static ncclResult_t init5(void** context, uint64_t commId, int* mask, const char* name, int nNodes, int nranks,
                          int rank, ncclDebugLogger_t logfn) {
  if (logfn) logfn(NCCL_LOG_INFO, NCCL_ABI_LOG_INIT, __FILE__, __LINE__, "simtest-prof: init through NCCL's logger");
  return common_init(context, commId, mask, name, nNodes, nranks, rank, 5);
}
static ncclResult_t start5(void* context, void** h, ncclProfilerEventDescr_v5_t* d) {
  if (d->type == ncclProfileColl) { LOG_COLL((ctx_t*)context, d) }
  *h = d->type == ncclProfileColl ? (void*)&handle : (void*)&other;
  return ncclSuccess;
}
__attribute__((visibility("default"))) ncclProfiler_v5_t ncclProfiler_v5 = {"simtest-prof", init5, start5, stopEvent,
                                                                           recordEventState, finalize};
#endif
