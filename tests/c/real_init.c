/* real_init.c - linked against a real libnccl.so.2: one single-rank ncclCommInitRank, as a
 * framework linked to NCCL makes it. Prints "init rc=<rc>" and NCCL's last error, and on stderr
 * the unique id's bytes in hex (they differ from run to run). */
#include <stdio.h>

#include "nccl_abi.h"

ncclResult_t ncclGetUniqueId(ncclUniqueId*);
ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int);
ncclResult_t ncclCommDestroy(ncclComm_t);
const char* ncclGetLastError(ncclComm_t);

int main(void) {
  ncclUniqueId id;
  ncclComm_t comm = 0;
  ncclResult_t rc = ncclGetUniqueId(&id);
  printf("uid rc=%d\n", (int)rc);
  fprintf(stderr, "uid ");
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) fprintf(stderr, "%02x", (unsigned char)id.internal[i]);
  fprintf(stderr, "\n");
  rc = ncclCommInitRank(&comm, 1, id, 0);
  printf("init rc=%d\n", (int)rc);
  printf("last error: %s\n", ncclGetLastError(comm));
  if (rc == ncclSuccess) ncclCommDestroy(comm);
  return 0;
}
