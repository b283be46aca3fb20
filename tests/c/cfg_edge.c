/* cfg_edge.c - ncclCommInitRankConfig with a config whose `size` says 8 bytes, placed at the very
 * end of a readable page (the next one is PROT_NONE): whoever reads past `size` (magic, version,
 * fields) faults. NCCL rejects it (size below the header) with ncclInvalidArgument.
 * usage: cfg_edge <libnccl.so> (opened RTLD_GLOBAL, called through the global scope, so a
 * preloaded probe's hook reads the config first) */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "nccl_abi.h"

int main(int argc, char** argv) {
  if (argc < 2 || !dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) return 3;
  ncclCommInitRankConfig_fn f = (ncclCommInitRankConfig_fn)dlsym(RTLD_DEFAULT, "ncclCommInitRankConfig");
  ncclResult_t (*uid)(ncclUniqueId*) = (ncclResult_t(*)(ncclUniqueId*))dlsym(RTLD_DEFAULT, "ncclGetUniqueId");
  if (!f || !uid) return 3;
  long page = sysconf(_SC_PAGESIZE);
  char* mem = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED || mprotect(mem + page, page, PROT_NONE) != 0) return 3;
  size_t size = 8;
  memcpy(mem + page - 8, &size, 8);
  ncclUniqueId id;
  uid(&id);
  ncclComm_t c = NULL;
  printf("rc=%d\n", (int)f(&c, 1, id, 0, (ncclConfig_t*)(mem + page - 8)));
  return 0;
}
