/* local_driver.c - loads the fake libnccl with RTLD_LOCAL, then a library linked against it, and
 * calls communicator init (1) through that library and (2) through the global symbol the preload
 * exports (dlsym(RTLD_DEFAULT)), from the main program, which links no libnccl at all.
 * usage: local_driver <libnccl.so.2 path> <liblocal_mid.so path> */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "nccl_abi.h"

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  void* nccl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  void* mid = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (!nccl || !mid) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 3;
  }
  /* libnccl is not in the global scope: only the preload (if any) defines this there. */
  printf("global ncclGetVersion=%s\n", dlsym(RTLD_DEFAULT, "ncclGetVersion") ? "yes" : "no");
  int (*mid_init)(int) = (int (*)(int))dlsym(mid, "mid_init");
  printf("mid_init rc=%d\n", mid_init(0));
  ncclCommInitRank_fn global_init = (ncclCommInitRank_fn)dlsym(RTLD_DEFAULT, "ncclCommInitRank");
  if (global_init) {
    ncclUniqueId id;
    memset(&id, 9, sizeof id);
    ncclComm_t c = 0;
    printf("global ncclCommInitRank rc=%d\n", (int)global_init(&c, 2, id, 1));
  } else {
    printf("global ncclCommInitRank absent\n");
  }
  return 0;
}
