/* prof_driver.c - drives a profiler plugin exactly as NCCL does (src/plugin/profiler.cc):
 * dlopen(RTLD_NOW|RTLD_LOCAL), dlsym("ncclProfiler_v<N>"), init per communicator with NCCL's
 * global mask, for each collective the events NCCL 2.28+ would deliver given that mask, in its
 * order, with filled descriptors: GroupApi (GroupStartApiStop, GroupEndApiStart), CollApi,
 * KernelLaunch, then Group and Coll (parentObj = the CollApi handle, parentGroup = the Group's),
 * KernelCh where a mode adds them; each event when the mask has any bit of its gate (GroupApi and
 * CollApi also for Coll, KernelCh, ...), stopEvent/recordEventState only for a non-NULL handle;
 * v4 as NCCL 2.27 (no API events, a Coll only under a Group handle); finalize per communicator.
 * usage: prof_driver <plugin.so> <version 4..7> <mode> [args]
 *   basic             two communicators, known collective mix, finalize both
 *   threads <t> <n>   t threads, each its own communicator and n collectives
 *   fork              parent and child each run a communicator
 *   exit              collectives, then exit without finalize
 *   shapes <k>        k distinct shapes on one communicator
 *   loop <n> [kernelch]  n collectives; prints ns per collective's events and RSS samples; with
 *                     kernelch each also gets 2 channels of KernelCh events (same thread)
 *   timed <n>         n collectives whose KernelCh events come from a proxy thread, racing the next
 *                     collectives; prints the sum of the simulated GPU durations
 *   graph <k> <r> <proxy 0|1>  k collectives captured, replayed r times from a callback thread
 *                     while k eager ones run
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

/* The masks NCCL tests before each event (src/plugin/profiler.cc; the copy-engine bits from 2.29, v6). */
#define PLAN_EVENTS (ncclProfileGroup | ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | \
                     ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin)
#define TASK_EVENTS (ncclProfileColl | ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | \
                     ncclProfileNetPlugin)
#define CE_EVENTS (ncclProfileCeColl | ncclProfileCeSync | ncclProfileCeBatch)
#define GROUPAPI_GATE (ncclProfileGroupApi | ncclProfileP2pApi | ncclProfileCollApi | ncclProfileKernelLaunch | \
                       PLAN_EVENTS | (version >= 6 ? CE_EVENTS : 0))
#define COLLAPI_GATE (ncclProfileCollApi | TASK_EVENTS | (version >= 6 ? CE_EVENTS : 0))

/* One collective as a kernel plan's task carries it: what it is, the mask when it was appended,
 * and (v5+) the CollApi handle, which a captured task keeps for every replay. */
struct task {
  int rank;
  const char* func;
  const char* algo;
  const char* proto;
  int nch;
  size_t count;
  const char* dtype;
  int mask;
  void* collApi;
};

static uint64_t seq_number; /* comm->seqNumber[func], one counter for the driver */

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* NCCL keeps whatever handle startEvent leaves (NULL at first), and stops or records only non-NULL ones. */
static void* start(void* ctx, void* descr) {
  void* h = NULL;
  if (version == 4) ((ncclProfiler_v4_t*)table)->startEvent(ctx, &h, (ncclProfilerEventDescr_v4_t*)descr);
  else ((ncclProfiler_v7_t*)table)->startEvent(ctx, &h, (ncclProfilerEventDescr_v7_t*)descr);
  return h;
}
static void stop(void* h) {
  if (h) ((ncclProfiler_v5_t*)table)->stopEvent(h); /* same slot in every version */
}
static void state(void* h, ncclProfilerEventState_t s, ncclProfilerEventStateArgs_v4_t* a) {
  if (h) ((ncclProfiler_v5_t*)table)->recordEventState(h, s, a);
}

/* KernelCh for one task (profilerProxyProgress): every channel starts, then each records its GPU
 * stop stamp and stops. Channel c starts c*100 ns after channel 0 and ends c*50 ns after it, so
 * the longest channel lasts `dur`. The v4 and v5+ kernelCh members sit at the same offset. */
static void kernel_ch(void* ctx, int rank, void* coll, int nch, uint64_t t0, uint64_t dur) {
  void* h[64];
  if (nch > 64) nch = 64;
  for (int c = 0; c < nch; c++) {
    ncclProfilerEventDescr_v7_t d;
    ncclProfilerEventDescr_v4_t* d4 = (ncclProfilerEventDescr_v4_t*)&d;
    memset(&d, 0, sizeof d);
    if (version == 4) {
      d4->type = ncclProfileKernelCh;
      d4->parentObj = coll;
      d4->rank = rank;
      d4->kernelCh.channelId = (uint8_t)c;
      d4->kernelCh.pTimer = t0 + 100ull * c;
    } else {
      d.type = ncclProfileKernelCh;
      d.parentObj = coll;
      d.rank = rank;
      d.kernelCh.channelId = (uint8_t)c;
      d.kernelCh.pTimer = t0 + 100ull * c;
    }
    h[c] = start(ctx, &d);
  }
  for (int c = 0; c < nch; c++) {
    ncclProfilerEventStateArgs_v4_t a;
    memset(&a, 0, sizeof a);
    a.kernelCh.pTimer = t0 + dur + 50ull * c;
    state(h[c], ncclProfilerKernelChStop, &a);
    stop(h[c]);
  }
}

/* ---- the simulated proxy progress thread: KernelCh events posted by any thread, delivered in order.
 * Its lag is bounded as NCCL's is (its GPU stamp ring holds 64 works per channel): at most RING
 * collectives behind, under the plugin's slots for collectives in flight. */
#define RING 256
struct kch_work {
  void* ctx;
  int rank;
  void* coll;
  int nch;
  uint64_t t0, dur;
};
static struct kch_work ring[RING];
static int ring_head, ring_count, proxy_stop, proxy_running;
static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ring_cond = PTHREAD_COND_INITIALIZER;
static pthread_t proxy_thread;

static void* proxy_main(void* arg) {
  pthread_mutex_lock(&ring_lock);
  for (;;) {
    while (!ring_count && !proxy_stop) pthread_cond_wait(&ring_cond, &ring_lock);
    if (!ring_count) break;
    struct kch_work w = ring[ring_head];
    ring_head = (ring_head + 1) % RING;
    ring_count--;
    pthread_cond_broadcast(&ring_cond);
    pthread_mutex_unlock(&ring_lock);
    kernel_ch(w.ctx, w.rank, w.coll, w.nch, w.t0, w.dur);
    pthread_mutex_lock(&ring_lock);
  }
  pthread_mutex_unlock(&ring_lock);
  return NULL;
}

static void proxy_post(struct kch_work w) {
  pthread_mutex_lock(&ring_lock);
  if (!proxy_running) {
    pthread_create(&proxy_thread, NULL, proxy_main, NULL);
    proxy_running = 1;
  }
  while (ring_count == RING) pthread_cond_wait(&ring_cond, &ring_lock);
  ring[(ring_head + ring_count) % RING] = w;
  ring_count++;
  pthread_cond_broadcast(&ring_cond);
  pthread_mutex_unlock(&ring_lock);
}

/* delivers what is queued, then joins the thread (before any finalize) */
static void proxy_join(void) {
  pthread_mutex_lock(&ring_lock);
  int running = proxy_running;
  proxy_stop = 1;
  pthread_cond_broadcast(&ring_cond);
  pthread_mutex_unlock(&ring_lock);
  if (running) pthread_join(proxy_thread, NULL);
  proxy_running = proxy_stop = 0;
}

/* ---- a collective's events */

/* GroupApi start, its GroupStartApiStop, CollApi start and stop, GroupEndApiStart, KernelLaunch
 * (enqueue.cc collTaskAppend, group.cc, ncclLaunchKernel). Returns the GroupApi handle, which the
 * caller stops after the plan's events (ncclGroupEndInternal's exit). v5+ only. */
static void* api_events(void* ctx, struct task* t, int captured) {
  ncclProfilerEventDescr_v7_t d;
  void* group_api = NULL;
  t->collApi = NULL;
  if (t->mask & GROUPAPI_GATE) {
    memset(&d, 0, sizeof d);
    d.type = ncclProfileGroupApi;
    d.rank = t->rank;
    d.groupApi.graphCaptured = captured;
    d.groupApi.groupDepth = 1; /* the collective's own group: the outermost */
    group_api = start(ctx, &d);
  }
  state(group_api, ncclProfilerGroupStartApiStop, NULL);
  if (t->mask & COLLAPI_GATE) {
    memset(&d, 0, sizeof d);
    d.type = ncclProfileCollApi;
    d.parentObj = group_api;
    d.rank = t->rank;
    d.collApi.func = t->func;
    d.collApi.count = t->count;
    d.collApi.datatype = t->dtype;
    d.collApi.stream = (void*)0x5;
    d.collApi.graphCaptured = captured;
    t->collApi = start(ctx, &d);
  }
  stop(t->collApi);
  state(group_api, ncclProfilerGroupEndApiStart, NULL);
  if (t->mask & ncclProfileKernelLaunch) {
    memset(&d, 0, sizeof d);
    d.type = ncclProfileKernelLaunch;
    d.parentObj = group_api;
    d.rank = t->rank;
    d.kernelLaunch.stream = (void*)0x5;
    stop(start(ctx, &d));
  }
  return group_api;
}

enum { KCH_NONE, KCH_INLINE, KCH_PROXY };

/* hostStreamPlanTask: Group start, Coll start, proxy ops posted (the proxy may start KernelCh
 * before Coll stops), Coll stop, Group stop. KernelCh only when the task's mask has it; with
 * KCH_INLINE they follow on this thread. In v4 (NCCL 2.27) a Coll starts only under a Group handle. */
static void plan_task(void* ctx, const struct task* t, int persistent, int kch, uint64_t dur) {
  ncclProfilerEventDescr_v7_t d;
  ncclProfilerEventDescr_v4_t* d4 = (ncclProfilerEventDescr_v4_t*)&d;
  void* group = NULL;
  void* coll = NULL;
  if (t->mask & PLAN_EVENTS) {
    memset(&d, 0, sizeof d);
    if (version == 4) d4->type = ncclProfileGroup;
    else d.type = ncclProfileGroup;
    group = start(ctx, &d);
  }
  int adv = !persistent || ((group || t->collApi) && (t->mask & ncclProfileKernelCh));
  uint64_t seq = adv ? __atomic_fetch_add(&seq_number, 1, __ATOMIC_RELAXED)
                     : __atomic_load_n(&seq_number, __ATOMIC_RELAXED);
  if ((t->mask & TASK_EVENTS) && (version != 4 || group)) {
    memset(&d, 0, sizeof d);
    if (version == 4) {
      d4->type = ncclProfileColl;
      d4->parentObj = group;
      d4->rank = t->rank;
      d4->coll.seqNumber = seq;
      d4->coll.func = t->func;
      d4->coll.count = t->count;
      d4->coll.datatype = t->dtype;
      d4->coll.nChannels = (uint8_t)t->nch;
      d4->coll.nWarps = 16;
      d4->coll.algo = t->algo;
      d4->coll.proto = t->proto;
    } else {
      /* the v7 descriptor: v5 and v6 lay out every coll member used here at the same offsets */
      d.type = ncclProfileColl;
      d.parentObj = t->collApi;
      d.rank = t->rank;
      d.coll.seqNumber = seq;
      d.coll.func = t->func;
      d.coll.count = t->count;
      d.coll.datatype = t->dtype;
      d.coll.nChannels = (uint8_t)t->nch;
      d.coll.nWarps = 16;
      d.coll.algo = t->algo;
      d.coll.proto = t->proto;
      d.coll.parentGroup = group;
    }
    coll = start(ctx, &d);
  }
  int kernel = kch != KCH_NONE && (t->mask & ncclProfileKernelCh);
  uint64_t t0 = now_ns() + 2000;
  if (kernel && kch == KCH_PROXY) proxy_post((struct kch_work){ctx, t->rank, coll, t->nch, t0, dur});
  stop(coll);
  stop(group);
  if (kernel && kch == KCH_INLINE) kernel_ch(ctx, t->rank, coll, t->nch, t0, dur);
}

/* An eager collective: API events (v5+), KernelLaunch, the plan's events, GroupApi stop. */
static void coll_k(void* ctx, int rank, const char* func, const char* algo, const char* proto, int nch, size_t count,
                   const char* dtype, int kch, uint64_t dur) {
  struct task t = {rank, func, algo, proto, nch, count, dtype, __atomic_load_n(&mask, __ATOMIC_RELAXED), NULL};
  void* group_api = version == 4 ? NULL : api_events(ctx, &t, 0);
  plan_task(ctx, &t, 0, kch, dur);
  stop(group_api);
}

static void coll(void* ctx, int rank, const char* func, const char* algo, const char* proto, int nch, size_t count,
                 const char* dtype) {
  coll_k(ctx, rank, func, algo, proto, nch, count, dtype, KCH_NONE, 0);
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

/* n collectives after n/10 of warm-up; RSS sampled ten times along the way. With kernelch, each
 * also gets its KernelCh events (2 channels, on this thread) when the mask has KernelCh. */
static void loop(long n, int kch) {
  void* ctx = comm_init(0x5eed, NULL, 8, 0);
  static const char* const protos[3] = {"LL", "LL128", "Simple"};
  struct timespec t0, t1;
  long warm = n / 10, step = n / 10 > 0 ? n / 10 : 1;
  long rss[11];
  int nrss = 0;
  int mode = kch ? KCH_INLINE : KCH_NONE;
  for (long i = 0; i < warm; i++)
    coll_k(ctx, 0, "AllReduce", "Ring", protos[i % 3], kch ? 2 : 4, (size_t)(i & 4095), "ncclFloat32", mode, 10000);
  rss[nrss++] = rss_kb();
  double ns = 0;
  for (long done = 0; done < n; done += step) {
    long chunk = n - done < step ? n - done : step;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < chunk; i++)
      coll_k(ctx, 0, "AllReduce", "Ring", protos[i % 3], kch ? 2 : 4, (size_t)(i & 4095), "ncclFloat32", mode, 10000);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ns += (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    if (nrss < 11) rss[nrss++] = rss_kb();
  }
  comm_finalize(ctx);
  printf("ns_per_coll=%.2f rss_kb=", ns / n);
  for (int i = 0; i < nrss; i++) printf(i ? ",%ld" : "%ld", rss[i]);
  printf("\n");
}

/* n all-reduces (Ring, LL, 2 channels, 1024 float32) whose KernelCh events come from the proxy
 * thread while this thread goes on with the next ones; collective i lasts (10 + i % 4) us on the
 * GPU (its longest channel). The proxy is joined before finalize. */
static void timed(long n) {
  void* ctx = comm_init(0x71, NULL, 2, 0);
  uint64_t sum = 0;
  for (long i = 0; i < n; i++) {
    uint64_t dur = 10000 + 1000 * (uint64_t)(i % 4);
    coll_k(ctx, 0, "AllReduce", "Ring", "LL", 2, 1024, "ncclFloat32", KCH_PROXY, dur);
    sum += dur;
  }
  proxy_join();
  comm_finalize(ctx);
  printf("timed=%ld gpu_ns_sum=%llu\n", n, (unsigned long long)sum);
}

/* ---- graph: capture k all-reduces, replay them r times from a host-callback thread while this
 * thread runs k eager ones. proxy=1: the captured plans have proxy ops (a network, or KernelCh in
 * the mask, which always adds them): Group/Coll fire at every replay from the callback thread, and
 * KernelCh from the proxy thread when the mask has it. proxy=0 (and no KernelCh in the mask):
 * Group/Coll fire once at capture, inside the captured GroupApi, and never at replay. */
#define MAX_CAPTURED 256
struct graph {
  void* ctx;
  struct task tasks[MAX_CAPTURED];
  int k, replays, callback;
};

static void* replay_main(void* p) {
  struct graph* g = (struct graph*)p;
  for (int r = 0; r < g->replays; r++)
    for (int i = 0; i < g->k; i++)
      if (g->callback) plan_task(g->ctx, &g->tasks[i], 1, KCH_PROXY, 10000 + 1000 * (uint64_t)i);
  return NULL;
}

static void graph(int k, int replays, int proxy) {
  static struct graph g;
  if (k > MAX_CAPTURED) k = MAX_CAPTURED;
  g.ctx = comm_init(0x96, NULL, 2, 0);
  g.k = k;
  g.replays = replays;
  int m = __atomic_load_n(&mask, __ATOMIC_RELAXED); /* the mask at capture is the graph's for good */
  g.callback = proxy || (m & ncclProfileKernelCh);
  for (int i = 0; i < k; i++) {
    struct task* t = &g.tasks[i];
    *t = (struct task){0, "AllReduce", "Ring", "LL", 2, 256 * (size_t)(i + 1), "ncclFloat32", m, NULL};
    void* group_api = version == 4 ? NULL : api_events(g.ctx, t, 1);
    if (!g.callback) plan_task(g.ctx, t, 1, KCH_NONE, 0);
    stop(group_api);
  }
  pthread_t cb;
  pthread_create(&cb, NULL, replay_main, &g);
  for (int i = 0; i < k; i++) coll_k(g.ctx, 0, "AllReduce", "Ring", "LL", 2, 256 * (size_t)(i + 1), "ncclFloat32",
                                     KCH_PROXY, 5000);
  pthread_join(cb, NULL);
  proxy_join();
  comm_finalize(g.ctx);
  printf("graph captures=%d replays=%d callback=%d eager=%d\n", k, replays, g.callback, k);
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
  } else if (!strcmp(mode, "loop")) loop(atol(argv[4]), argc > 5 && !strcmp(argv[5], "kernelch"));
  else if (!strcmp(mode, "timed")) timed(atol(argv[4]));
  else if (!strcmp(mode, "graph") && argc > 6) graph(atoi(argv[4]), atoi(argv[5]), atoi(argv[6]));
  else if (!strcmp(mode, "forkexit")) forkexit(atoi(argv[4]));
  else if (!strcmp(mode, "maskkeep")) maskkeep();
  else return 2;
  printf("mask=0x%x\n", mask);
  return 0;
}
