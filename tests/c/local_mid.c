/* local_mid.c - a library linked against libnccl.so.2 that a driver dlopen()s with RTLD_LOCAL,
 * as PyTorch loads libtorch_cuda: libnccl then sits in a local scope where dlsym(RTLD_NEXT)
 * from the preload cannot see it (reference/observed.md). */
#include "nccl_abi.h"

ncclResult_t ncclGetUniqueId(ncclUniqueId*);
ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int);
ncclResult_t ncclCommDestroy(ncclComm_t);

__attribute__((visibility("default"))) int mid_init(int rank) {
  ncclUniqueId id;
  ncclComm_t c = 0;
  ncclGetUniqueId(&id);
  int rc = ncclCommInitRank(&c, 2, id, rank);
  if (rc == 0) ncclCommDestroy(c);
  return rc;
}
