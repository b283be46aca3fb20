/* rec_profiler.c - a profiler plugin that records every call NCCL makes to it, one line each, to
 * $REC_PROF_LOG: the call, the event type, the handle it returned and the parent it was given (as
 * small numbers: 0 is NULL, -1 a pointer it never returned), graphCaptured, the calling thread and process, the
 * KernelCh channel and pTimer, the Coll fields. It asks for the mask in $REC_PROF_MASK (hex,
 * default ncclProfileColl) and returns NULL for the event types in $REC_PROF_NULL (hex).
 * ncclProfiler_v5, or ncclProfiler_v4 when built with -DREC_V4. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "nccl_abi.h"

#define EXPORT __attribute__((visibility("default")))
#define NHANDLES (1 << 20)

static char handles[NHANDLES]; /* handle n is &handles[n] */
static unsigned next_handle;
static FILE* out;
static int null_types;
static char ctx_mem[64];
static unsigned nctx;

static long tid(void) { return (long)syscall(SYS_gettid); }

static const char* type_name(uint64_t t) {
  switch (t) {
    case ncclProfileGroup: return "Group";
    case ncclProfileColl: return "Coll";
    case ncclProfileP2p: return "P2p";
    case ncclProfileKernelCh: return "KernelCh";
    case ncclProfileGroupApi: return "GroupApi";
    case ncclProfileCollApi: return "CollApi";
    case ncclProfileKernelLaunch: return "KernelLaunch";
    default: return "Other";
  }
}

/* a pointer as a small number: 0 NULL, n for &handles[n], -1 for anything else */
static long ident(const void* p) {
  if (!p) return 0;
  const char* c = (const char*)p;
  return c > handles && c < handles + NHANDLES ? (long)(c - handles) : -1;
}

static void* new_handle(uint64_t type) {
  if (null_types & (int)type) return NULL;
  unsigned n = __atomic_add_fetch(&next_handle, 1, __ATOMIC_RELAXED);
  return n < NHANDLES ? &handles[n] : NULL;
}

static ncclResult_t common_init(void** context, int* mask, const char* name, uint64_t hash, int nranks, int rank,
                                int version) {
  if (!out) {
    const char* path = getenv("REC_PROF_LOG");
    out = path ? fopen(path, "a") : NULL;
    if (out) setvbuf(out, NULL, _IOLBF, 0);
    const char* n = getenv("REC_PROF_NULL");
    null_types = n ? (int)strtol(n, NULL, 16) : 0;
  }
  const char* m = getenv("REC_PROF_MASK");
  *mask = m ? (int)strtol(m, NULL, 16) : ncclProfileColl;
  unsigned c = __atomic_fetch_add(&nctx, 1, __ATOMIC_RELAXED) % sizeof(ctx_mem);
  *context = &ctx_mem[c];
  if (out)
    fprintf(out, "init v=%d ctx=%u hash=0x%llx nranks=%d rank=%d mask=0x%x tid=%ld pid=%d\n", version, c,
            (unsigned long long)hash, nranks, rank, *mask, tid(), (int)getpid());
  return ncclSuccess;
}

static ncclResult_t stop_event(void* h) {
  if (out) fprintf(out, "stop h=%ld tid=%ld pid=%d\n", ident(h), tid(), (int)getpid());
  return ncclSuccess;
}

static ncclResult_t record_state(void* h, ncclProfilerEventState_t s, ncclProfilerEventStateArgs_v4_t* a) {
  if (out) {
    if (s == ncclProfilerKernelChStop && a)
      fprintf(out, "record h=%ld state=%d ptimer=%llu tid=%ld pid=%d\n", ident(h), (int)s,
              (unsigned long long)a->kernelCh.pTimer, tid(), (int)getpid());
    else
      fprintf(out, "record h=%ld state=%d args=%d tid=%ld pid=%d\n", ident(h), (int)s, a != NULL, tid(), (int)getpid());
  }
  return ncclSuccess;
}

static ncclResult_t finalize(void* context) {
  if (out) fprintf(out, "finalize ctx=%ld tid=%ld pid=%d\n", (long)((char*)context - ctx_mem), tid(), (int)getpid());
  return ncclSuccess;
}

#define LOG_START(d, h, extra_fmt, ...)                                                                            \
  fprintf(out, "start type=%s h=%ld parent=%ld rank=%d tid=%ld pid=%d" extra_fmt "\n", type_name((d)->type), ident(h), \
          ident((d)->parentObj), (d)->rank, tid(), (int)getpid(), __VA_ARGS__)

#define LOG_COMMON(d, h)                                                                                           \
  if ((d)->type == ncclProfileKernelCh)                                                                          \
    LOG_START(d, h, " ch=%d ptimer=%llu", (int)(d)->kernelCh.channelId, (unsigned long long)(d)->kernelCh.pTimer); \
  else if ((d)->type == ncclProfileGroup)                                                                        \
    LOG_START(d, h, "%s", "");

#ifdef REC_V4
static ncclResult_t init_v4(void** context, int* mask, const char* name, uint64_t hash, int nNodes, int nranks,
                            int rank, ncclDebugLogger_t logfn) {
  return common_init(context, mask, name, hash, nranks, rank, 4);
}
static ncclResult_t start_v4(void* context, void** eHandle, ncclProfilerEventDescr_v4_t* d) {
  void* h = new_handle(d->type);
  *eHandle = h;
  if (!out) return ncclSuccess;
  LOG_COMMON(d, h)
  else if (d->type == ncclProfileColl)
    LOG_START(d, h, " seq=%llu func=%s algo=%s proto=%s nch=%d count=%zu dt=%s",
              (unsigned long long)d->coll.seqNumber, d->coll.func, d->coll.algo, d->coll.proto,
              (int)d->coll.nChannels, d->coll.count, d->coll.datatype);
  else LOG_START(d, h, "%s", "");
  return ncclSuccess;
}
EXPORT ncclProfiler_v4_t ncclProfiler_v4 = {"rec4", init_v4, start_v4, stop_event, record_state, finalize};
#else
static ncclResult_t init_v5(void** context, uint64_t hash, int* mask, const char* name, int nNodes, int nranks,
                            int rank, ncclDebugLogger_t logfn) {
  return common_init(context, mask, name, hash, nranks, rank, 5);
}
static ncclResult_t start_v5(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* d) {
  void* h = new_handle(d->type);
  *eHandle = h;
  if (!out) return ncclSuccess;
  LOG_COMMON(d, h)
  else if (d->type == ncclProfileColl)
    LOG_START(d, h, " pgroup=%ld seq=%llu func=%s algo=%s proto=%s nch=%d count=%zu dt=%s", ident(d->coll.parentGroup),
              (unsigned long long)d->coll.seqNumber, d->coll.func, d->coll.algo, d->coll.proto,
              (int)d->coll.nChannels, d->coll.count, d->coll.datatype);
  else if (d->type == ncclProfileGroupApi)
    LOG_START(d, h, " cap=%d depth=%d", (int)d->groupApi.graphCaptured, d->groupApi.groupDepth);
  else if (d->type == ncclProfileCollApi)
    LOG_START(d, h, " cap=%d func=%s count=%zu dt=%s stream=%p", (int)d->collApi.graphCaptured, d->collApi.func,
              d->collApi.count, d->collApi.datatype, d->collApi.stream);
  else if (d->type == ncclProfileKernelLaunch)
    LOG_START(d, h, " stream=%p", d->kernelLaunch.stream);
  else LOG_START(d, h, "%s", "");
  return ncclSuccess;
}
EXPORT ncclProfiler_v5_t ncclProfiler_v5 = {"rec5", init_v5, start_v5, stop_event, record_state, finalize};
#endif
