/* empty_profiler.c - the baseline for benchmarks/probe_profiler_cost.py: a profiler plugin that
 * asks for the same events as ncclprobe's and does nothing with them, so the difference per
 * collective is ncclprobe's own work. The mask is ncclProfileColl, or $EMPTY_PROFILER_MASK (hex)
 * where ncclprobe asks for more (KernelCh to time collectives on the GPU): NCCL's, and the test
 * driver's, event stream depends on the mask alone. */
#include <stdlib.h>

#include "nccl_abi.h"

#define EXPORT __attribute__((visibility("default")))

static char ctx;
static char group;

static int wanted(void) {
  const char* m = getenv("EMPTY_PROFILER_MASK");
  return m ? (int)strtol(m, NULL, 16) : ncclProfileColl;
}

static ncclResult_t init_v4(void** c, int* mask, const char* name, uint64_t hash, int nn, int nr, int r,
                            ncclDebugLogger_t log) {
  *c = &ctx;
  *mask = wanted();
  return ncclSuccess;
}
static ncclResult_t init_v5(void** c, uint64_t id, int* mask, const char* name, int nn, int nr, int r,
                            ncclDebugLogger_t log) {
  *c = &ctx;
  *mask = wanted();
  return ncclSuccess;
}
static ncclResult_t start_v4(void* c, void** h, ncclProfilerEventDescr_v4_t* d) {
  *h = d->type == ncclProfileGroup ? &group : 0; /* NCCL 2.27 needs a group handle, as ncclprobe gives */
  return ncclSuccess;
}
static ncclResult_t start_v5(void* c, void** h, ncclProfilerEventDescr_v5_t* d) {
  *h = 0;
  return ncclSuccess;
}
static ncclResult_t stop(void* h) { return ncclSuccess; }
static ncclResult_t state(void* h, ncclProfilerEventState_t s, ncclProfilerEventStateArgs_v4_t* a) {
  return ncclSuccess;
}
static ncclResult_t fini(void* c) { return ncclSuccess; }

EXPORT ncclProfiler_v4_t ncclProfiler_v4 = {"empty", init_v4, start_v4, stop, state, fini};
EXPORT ncclProfiler_v5_t ncclProfiler_v5 = {"empty", init_v5, start_v5, stop, state, fini};
