/* Test LD_PRELOAD hook: counts ncclCommInitRankConfig calls that reach it (to $SIMTEST_HOOK_LOG) and
 * forwards to the loaded libnccl's strong symbol (RTLD_NEXT is unreliable under local loading). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../probes/include/nccl_abi.h"

__attribute__((visibility("default"))) ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks,
                                                                           ncclUniqueId id, int rank,
                                                                           ncclConfig_t* config) {
  const char* path = getenv("SIMTEST_HOOK_LOG");
  FILE* f = path ? fopen(path, "a") : NULL;
  if (f) { fprintf(f, "hooked ncclCommInitRankConfig rank=%d\n", rank); fclose(f); }
  void* lib = dlopen("libnccl.so.2", RTLD_NOLOAD | RTLD_LAZY);
  ncclCommInitRankConfig_fn real = lib ? (ncclCommInitRankConfig_fn)dlsym(lib, "pncclCommInitRankConfig") : NULL;
  return real ? real(comm, nranks, id, rank, config) : ncclInternalError;
}
