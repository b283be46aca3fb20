/* lock_driver.c - is a profiler init held up while the probe asks another library its version?
 * A thread inits a communicator from inside libslow_nccl.so, whose ncclGetVersion waits (up to 2 s)
 * to be released; meanwhile the main thread inits one from the program itself (another library to
 * the probe), times that init, then releases the first. NCCL's ncclGetVersion is trivial, but any
 * object's can block, or need a lock our other thread holds (the loader lock, in dlopen).
 * usage: lock_driver <plugin.so> <libslow_nccl.so>; prints blocked_ms=<main's init time>. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "nccl_abi.h"

static ncclProfiler_v5_t* prof;
static int (*slow_comm_init)(ncclProfiler_v5_t*);

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {}

static void* slow_thread(void* p) {
  slow_comm_init(prof);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  void* slow = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (!h || !slow) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 3;
  }
  prof = (ncclProfiler_v5_t*)dlsym(h, "ncclProfiler_v5");
  slow_comm_init = (int (*)(ncclProfiler_v5_t*))dlsym(slow, "slow_comm_init");
  int (*entered)(void) = (int (*)(void))dlsym(slow, "slow_entered");
  void (*release)(void) = (void (*)(void))dlsym(slow, "slow_release");
  if (!prof || !slow_comm_init || !entered || !release) return 3;
  pthread_t t;
  pthread_create(&t, NULL, slow_thread, NULL);
  while (!entered()) usleep(500);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  void* ctx = NULL;
  static int mask;
  prof->init(&ctx, 0x52, &mask, "main", 1, 2, 1, logger);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  release();
  pthread_join(t, NULL);
  if (ctx) prof->finalize(ctx);
  printf("blocked_ms=%ld\n", (long)((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000));
  return 0;
}
