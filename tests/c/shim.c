/* shim.c - another interposer of ncclCommInitRank/ncclCommDestroy (a tracing shim), preloaded
 * ahead of the probe: it forwards with dlsym(RTLD_NEXT), as such shims do. Returns 99 instead of
 * recursing without end if the forward comes back to it (the failure the test looks for).
 * -DCLAIMS_NCCL: it also defines ncclGetVersion, so it passes for NCCL itself and the probe's
 * resolution sends its calls back to it: only the probe's re-entry bound ends that cycle. */
#include <dlfcn.h>
#include <stdio.h>

#include "nccl_abi.h"

#define EXPORT __attribute__((visibility("default")))

static __thread int depth;

#ifdef CLAIMS_NCCL
EXPORT ncclResult_t ncclGetVersion(int* v) {
  *v = 22809;
  return ncclSuccess;
}
#endif

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* c, int n, ncclUniqueId id, int r) {
  if (depth > 20) {
    fprintf(stderr, "shim: ncclCommInitRank recursion\n");
    return (ncclResult_t)99;
  }
  ncclCommInitRank_fn next = (ncclCommInitRank_fn)dlsym(RTLD_NEXT, "ncclCommInitRank");
  depth++;
  ncclResult_t rc = next(c, n, id, r);
  depth--;
  return rc;
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (depth > 20) {
    fprintf(stderr, "shim: ncclCommDestroy recursion\n");
    return (ncclResult_t)99;
  }
  ncclCommFinalize_fn next = (ncclCommFinalize_fn)dlsym(RTLD_NEXT, "ncclCommDestroy");
  depth++;
  ncclResult_t rc = next(c);
  depth--;
  return rc;
}
