/* slow_nccl.c - a libnccl stand-in whose ncclGetVersion does not return until the driver says so
 * (or 2 s pass), and which calls a profiler plugin's init from inside itself, as NCCL does; the
 * probe asks the version of a library the first time it meets it. See lock_driver.c. */
#include <unistd.h>

#include "nccl_abi.h"

#define EXPORT __attribute__((visibility("default")))

static int entered, released;

EXPORT ncclResult_t ncclGetVersion(int* v) {
  __atomic_store_n(&entered, 1, __ATOMIC_RELEASE);
  int i;
  for (i = 0; i < 2000 && !__atomic_load_n(&released, __ATOMIC_ACQUIRE); i++) usleep(1000);
  *v = i < 2000 ? 22809 : 1; /* 1: nobody released us in time */
  return ncclSuccess;
}

EXPORT int slow_entered(void) { return __atomic_load_n(&entered, __ATOMIC_ACQUIRE); }
EXPORT void slow_release(void) { __atomic_store_n(&released, 1, __ATOMIC_RELEASE); }

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {}

EXPORT int slow_comm_init(ncclProfiler_v5_t* prof) {
  void* ctx = NULL;
  static int mask;
  int rc = prof->init(&ctx, 0x51, &mask, "slow", 1, 2, 0, logger);
  if (ctx) prof->finalize(ctx);
  return rc;
}
