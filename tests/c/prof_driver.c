/* prof_driver.c - drives a profiler plugin exactly as NCCL does (src/plugin/profiler.cc):
 * dlopen(RTLD_NOW|RTLD_LOCAL), dlsym("ncclProfiler_v<N>"), init per communicator with NCCL's
 * global mask, for each collective the group/API/collective events NCCL would start given that
 * mask, with filled descriptors, stopEvent only for a non-NULL handle, finalize per
 * communicator.
 * usage: prof_driver <plugin.so> <version 4..7> <mode> [args]
 *   basic             two communicators, known collective mix, finalize both
 *   threads <t> <n>   t threads, each its own communicator and n collectives
 *   fork              parent and child each run a communicator
 *   exit              collectives, then exit without finalize
 *   shapes <k>        k distinct shapes on one communicator
 *   loop <n>          n collectives; prints ns per collective's events and RSS samples
 *   forkexit <n>      a thread creates, uses (64 shapes) and finalizes communicators in a loop
 *                     while the main thread forks n children that exit() at once; prints how
 *                     many children did not exit within 2 s (killed then)
 *   maskkeep          one communicator, then the host closes every descriptor and unsets
 *                     NCCLPROBE_DIR (the probe goes silent), then a second one: prints the
 *                     global mask after each init */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl_abi.h"

static int version;
static int mask; /* NCCL's global ncclProfilerEventMask */
static void* table;

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {}

static void* comm_init(uint64_t hash, const char* name, int nranks, int rank) {
  void* ctx = NULL;
  ncclResult_t rc;
  if (version == 4)
    rc = ((ncclProfiler_v4_t*)table)->init(&ctx, &mask, name, hash, 1, nranks, rank, logger);
  else /* v5, v6 and v7 share the init signature */
    rc = ((ncclProfiler_v5_t*)table)->init(&ctx, hash, &mask, name, 1, nranks, rank, logger);
  if (rc != ncclSuccess) {
    fprintf(stderr, "init rc=%d\n", (int)rc);
    exit(4);
  }
  return ctx;
}

static void comm_finalize(void* ctx) {
  if (!ctx) return;
  ((ncclProfiler_v5_t*)table)->finalize(ctx); /* same slot in every version */
}

/* One collective, under the conditions NCCL applies (src/plugin/profiler.cc): the collective API
 * event (v5+) if asked for, the group event whenever any plan-level event is asked for, the
 * collective event (in v4 / NCCL 2.27 only under a non-NULL group handle), stopEvent only for
 * non-NULL handles, innermost first. */
#define PLAN_EVENTS (ncclProfileGroup | ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | \
                     ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin)
#define TASK_EVENTS (ncclProfileColl | ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | \
                     ncclProfileNetPlugin)

static void coll(void* ctx, int rank, const char* func, const char* algo, const char* proto, int nch, size_t count,
                 const char* dtype) {
  void* group = NULL;
  void* api = NULL;
  void* h = NULL;
  if (version == 4) {
    ncclProfiler_v4_t* p = (ncclProfiler_v4_t*)table;
    ncclProfilerEventDescr_v4_t d;
    if (mask & PLAN_EVENTS) {
      memset(&d, 0, sizeof d);
      d.type = ncclProfileGroup;
      p->startEvent(ctx, &group, &d);
    }
    if (group && (mask & TASK_EVENTS)) {
      memset(&d, 0, sizeof d);
      d.type = ncclProfileColl;
      d.parentObj = group;
      d.rank = rank;
      d.coll.func = func;
      d.coll.count = count;
      d.coll.datatype = dtype;
      d.coll.nChannels = (uint8_t)nch;
      d.coll.nWarps = 16;
      d.coll.algo = algo;
      d.coll.proto = proto;
      p->startEvent(ctx, &h, &d);
      if (h) p->stopEvent(h);
    }
    if (group) p->stopEvent(group);
    return;
  }
  /* v5/v6/v7: the v7 descriptor; v5 and v6 lay out type, parentObj, rank and every coll member
   * used here at the same offsets (nccl_abi.h asserts it). */
  ncclProfiler_v7_t* p = (ncclProfiler_v7_t*)table;
  ncclProfilerEventDescr_v7_t d;
  if (mask & ncclProfileCollApi) {
    memset(&d, 0, sizeof d);
    d.type = ncclProfileCollApi;
    d.collApi.func = func;
    d.collApi.count = count;
    d.collApi.datatype = dtype;
    p->startEvent(ctx, &api, &d);
  }
  if (mask & PLAN_EVENTS) {
    memset(&d, 0, sizeof d);
    d.type = ncclProfileGroup;
    p->startEvent(ctx, &group, &d);
  }
  if (mask & TASK_EVENTS) {
    memset(&d, 0, sizeof d);
    d.type = ncclProfileColl;
    d.parentObj = api;
    d.rank = rank;
    d.coll.seqNumber = 1;
    d.coll.func = func;
    d.coll.count = count;
    d.coll.datatype = dtype;
    d.coll.nChannels = (uint8_t)nch;
    d.coll.nWarps = 16;
    d.coll.algo = algo;
    d.coll.proto = proto;
    d.coll.parentGroup = group;
    p->startEvent(ctx, &h, &d);
    if (h) p->stopEvent(h);
  }
  if (group) p->stopEvent(group);
  if (api) p->stopEvent(api);
}

static void basic(void) {
  void* a = comm_init(0xabcdef, "tp", 2, 0);
  void* b = comm_init(0x1234, NULL, 4, 3);
  char proto[8];
  for (int i = 0; i < 100; i++) coll(a, 0, "AllReduce", "Ring", "LL", 2, 256, "ncclFloat32");
  for (int i = 0; i < 50; i++) coll(a, 0, "AllReduce", "Ring", "LL", 2, 1024, "ncclFloat32");
  for (int i = 0; i < 30; i++) coll(a, 0, "AllGather", "Ring", "Simple", 4, 10 + i, "ncclInt8");
  /* Same text through a different pointer each time: must land in the same shape. */
  for (int i = 0; i < 5; i++) {
    strcpy(proto, "LL");
    coll(a, 0, "AllReduce", "Ring", proto, 2, 512, "ncclBfloat16");
  }
  for (int i = 0; i < 10; i++) coll(b, 3, "ReduceScatter", "Tree", "LL128", 8, 1 << 20, "ncclFloat64");
  comm_finalize(a);
  comm_finalize(b);
}

struct targ {
  int id, n;
};

static void* thread_main(void* p) {
  struct targ* t = (struct targ*)p;
  void* ctx = comm_init(0x100 + (uint64_t)t->id, NULL, 8, t->id % 8);
  for (int i = 0; i < t->n; i++) coll(ctx, t->id % 8, "AllReduce", "Ring", (t->id & 1) ? "LL" : "Simple", 2, 64, "ncclFloat32");
  comm_finalize(ctx);
  return NULL;
}

static void threads(int nt, int n) {
  pthread_t th[128];
  struct targ args[128];
  if (nt > 128) nt = 128;
  for (int i = 0; i < nt; i++) {
    args[i] = (struct targ){i, n};
    pthread_create(&th[i], NULL, thread_main, &args[i]);
  }
  for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
}

static void forked(void) {
  void* a = comm_init(0xaaaa, NULL, 2, 0);
  for (int i = 0; i < 10; i++) coll(a, 0, "AllReduce", "Ring", "LL", 2, 100, "ncclFloat32");
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    void* c = comm_init(0xcccc, NULL, 2, 1);
    for (int i = 0; i < 5; i++) coll(c, 1, "Broadcast", "Ring", "Simple", 1, 100, "ncclFloat32");
    comm_finalize(c);
    printf("child %d\n", (int)getpid());
    fflush(stdout);
    _exit(0);
  }
  int st;
  waitpid(pid, &st, 0);
  for (int i = 0; i < 10; i++) coll(a, 0, "AllReduce", "Ring", "LL", 2, 100, "ncclFloat32");
  comm_finalize(a);
  printf("parent %d child-status %d\n", (int)getpid(), st);
}

static long rss_kb(void) {
  FILE* f = fopen("/proc/self/statm", "r");
  long pages = 0, res = 0;
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
    fclose(f);
  }
  return res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* n collectives after n/10 of warm-up; RSS sampled ten times along the way. */
static void loop(long n) {
  void* ctx = comm_init(0x5eed, NULL, 8, 0);
  static const char* const protos[3] = {"LL", "LL128", "Simple"};
  struct timespec t0, t1;
  long warm = n / 10, step = n / 10 > 0 ? n / 10 : 1;
  long rss[11];
  int nrss = 0;
  for (long i = 0; i < warm; i++) coll(ctx, 0, "AllReduce", "Ring", protos[i % 3], 4, (size_t)(i & 4095), "ncclFloat32");
  rss[nrss++] = rss_kb();
  double ns = 0;
  for (long done = 0; done < n; done += step) {
    long chunk = n - done < step ? n - done : step;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < chunk; i++)
      coll(ctx, 0, "AllReduce", "Ring", protos[i % 3], 4, (size_t)(i & 4095), "ncclFloat32");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ns += (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    if (nrss < 11) rss[nrss++] = rss_kb();
  }
  comm_finalize(ctx);
  printf("ns_per_coll=%.2f rss_kb=", ns / n);
  for (int i = 0; i < nrss; i++) printf(i ? ",%ld" : "%ld", rss[i]);
  printf("\n");
}

static int stop_churn;

static void* churn(void* p) {
  char names[64][8];
  for (int i = 0; i < 64; i++) snprintf(names[i], sizeof names[i], "F%d", i);
  while (!__atomic_load_n(&stop_churn, __ATOMIC_RELAXED)) {
    void* ctx = comm_init(0xf0f0, NULL, 2, 0);
    for (int i = 0; i < 64; i++) coll(ctx, 0, names[i], "Ring", "LL", 2, 4, "ncclFloat32");
    comm_finalize(ctx); /* 64 coll_summary lines */
    usleep(200);         /* keeps the log small; the fork window stays wide */
  }
  return NULL;
}

static void forkexit(int n) {
  pthread_t t;
  pthread_create(&t, NULL, churn, NULL);
  usleep(20000);
  int hung = 0, done = 0;
  fflush(stdout);
  for (; done < n && !hung; done++) {
    pid_t c = fork();
    if (c == 0) exit(0); /* a normal exit: runs the library destructors (the exit flush) */
    int st, waited;
    for (waited = 0; waited < 2000; waited++) {
      if (waitpid(c, &st, WNOHANG) == c) break;
      usleep(1000);
    }
    if (waited == 2000) {
      hung++;
      kill(c, SIGKILL);
      waitpid(c, &st, 0);
    }
  }
  __atomic_store_n(&stop_churn, 1, __ATOMIC_RELAXED);
  pthread_join(t, NULL);
  printf("forks=%d hung=%d\n", done, hung);
}

static void maskkeep(void) {
  void* a = comm_init(0xa1, NULL, 2, 0);
  printf("mask_a=0x%x\n", mask);
  for (int fd = 3; fd < 1024; fd++) close(fd); /* a host that closes every descriptor */
  unsetenv("NCCLPROBE_DIR");
  void* b = comm_init(0xb2, NULL, 2, 1);
  printf("mask_b=0x%x\n", mask);
  for (int i = 0; i < 3; i++) coll(a, 0, "AllReduce", "Ring", "LL", 2, 8, "ncclFloat32");
  comm_finalize(b);
  comm_finalize(a);
}

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  version = atoi(argv[2]);
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 3;
  }
  char sym[32];
  snprintf(sym, sizeof sym, "ncclProfiler_v%d", version);
  table = dlsym(h, sym);
  if (!table) {
    fprintf(stderr, "no %s\n", sym);
    return 3;
  }
  const char* mode = argv[3];
  if (!strcmp(mode, "basic")) basic();
  else if (!strcmp(mode, "threads")) threads(atoi(argv[4]), atoi(argv[5]));
  else if (!strcmp(mode, "fork")) forked();
  else if (!strcmp(mode, "exit")) {
    void* a = comm_init(0xe1, NULL, 2, 0);
    for (int i = 0; i < 7; i++) coll(a, 0, "AllReduce", "Tree", "Simple", 1, 8, "ncclFloat32");
  } else if (!strcmp(mode, "shapes")) {
    void* a = comm_init(0x5a, NULL, 2, 0);
    int k = atoi(argv[4]);
    for (int i = 0; i < k; i++) coll(a, 0, "AllReduce", "Ring", "LL", (i % 255) + 1, (size_t)8 << (i / 255), "ncclFloat32");
    comm_finalize(a);
  } else if (!strcmp(mode, "loop")) loop(atol(argv[4]));
  else if (!strcmp(mode, "forkexit")) forkexit(atoi(argv[4]));
  else if (!strcmp(mode, "maskkeep")) maskkeep();
  else return 2;
  printf("mask=0x%x\n", mask);
  return 0;
}
