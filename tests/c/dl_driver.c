/* dl_driver.c - dlopen()s each library given (RTLD_NOW|RTLD_LOCAL, as NCCL opens its plugins),
 * then calls ncclCommInitRank through the global scope (the preloaded probe, if any) and prints
 * its return code.
 * usage: dl_driver <lib.so>... */
#include <dlfcn.h>
#include <stdio.h>

#include "nccl_abi.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; i++)
    if (!dlopen(argv[i], RTLD_NOW | RTLD_LOCAL)) {
      fprintf(stderr, "dlopen: %s\n", dlerror());
      return 3;
    }
  ncclCommInitRank_fn f = (ncclCommInitRank_fn)dlsym(RTLD_DEFAULT, "ncclCommInitRank");
  if (!f) {
    printf("no ncclCommInitRank\n");
    return 0;
  }
  ncclUniqueId id = {{0}};
  ncclComm_t c = 0;
  printf("rc=%d\n", (int)f(&c, 1, id, 0));
  return 0;
}
