/* profiler.c - NCCL_PROFILER_PLUGIN through the real ABI, as NCCL 2.28.9 drives it
 * (src/plugin/profiler.cc): the library loads with the first communicator (refcounted) and closes
 * with the last; "ncclProfiler_v5" is looked up first, then "ncclProfiler_v4"; init runs per
 * communicator with its commHash; finalize runs at destroy.
 *
 * Per all-reduce on more than one rank (v5): GroupApi start, its GroupStartApiStop, CollApi start
 * and stop, GroupEndApiStart, KernelLaunch, then the plan's Group start, Coll start (parentObj =
 * the CollApi handle), Coll stop, Group stop, then GroupApi stop, all on the caller's thread; with
 * ncclProfileKernelCh, per channel KernelCh start / KernelChStop / stop from the proxy thread,
 * with simulated %globaltimer stamps. Under stream capture the API events say graphCaptured; with
 * KernelCh (proxy ops) Group/Coll move to a host callback that runs at every replay, without it
 * they fire once at capture. v4 plugins get Group and, under a non-NULL Group handle, Coll (2.27).
 * Each gate is NCCL's: an event fires when the mask has any of the bits that need it.
 */
#include <dlfcn.h>
#include <limits.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "sim.h"

/* the masks NCCL tests before each event (profiler.cc, 2.28: no copy-engine bits yet) */
#define GROUPAPI_GATE (ncclProfileGroupApi | ncclProfileP2pApi | ncclProfileCollApi | ncclProfileKernelLaunch | \
                       ncclProfileGroup | ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp |               \
                       ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin)
#define COLLAPI_GATE (ncclProfileCollApi | ncclProfileColl | ncclProfileProxyOp | ncclProfileProxyStep | \
                      ncclProfileKernelCh | ncclProfileNetPlugin)
#define GROUP_GATE (ncclProfileGroup | ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep | \
                    ncclProfileKernelCh | ncclProfileNetPlugin)
#define TASK_GATE (ncclProfileColl | ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | \
                   ncclProfileNetPlugin)

static pthread_mutex_t profLock = PTHREAD_MUTEX_INITIALIZER;
static void* profLib;
static int profRefs;
static int profVersion; /* 5, 4, or 0 (none) */
static ncclProfiler_v5_t* profV5;
static ncclProfiler_v4_t* profV4;
static int profMask; /* NCCL keeps one global mask: the last init's */
static char profName[256];

static void* openPlugin(void) {
  const char* name = simGetEnv("NCCL_PROFILER_PLUGIN");
  char alt[PATH_MAX];
  void* lib;
  if (name) {
    INFO(SIM_ENV, "NCCL_PROFILER_PLUGIN set by environment to %s", name);
    if (strcasecmp(name, "none") == 0) return NULL;
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib && !strchr(name, '/')) { /* plugin_open.cc: then libnccl-profiler-<name>.so */
      snprintf(alt, sizeof(alt), "libnccl-profiler-%s.so", name);
      lib = dlopen(alt, RTLD_NOW | RTLD_LOCAL);
    }
    if (!lib) INFO(SIM_INIT | SIM_ENV, "PROFILER/Plugin: Could not load %s: %s", name, dlerror());
    return lib;
  }
  return dlopen("libnccl-profiler.so", RTLD_NOW | RTLD_LOCAL);
}

/* called with profLock held */
static void loadLocked(void) {
  if (profRefs++ > 0) return;
  profVersion = 0;
  profLib = openPlugin();
  if (!profLib) return;
  profV5 = (ncclProfiler_v5_t*)dlsym(profLib, "ncclProfiler_v5");
  if (profV5 && profV5->init) {
    profVersion = 5;
  } else {
    profV5 = NULL;
    profV4 = (ncclProfiler_v4_t*)dlsym(profLib, "ncclProfiler_v4");
    if (profV4 && profV4->init) profVersion = 4;
  }
  if (!profVersion) {
    INFO(SIM_INIT | SIM_ENV, "PROFILER/Plugin: failed to find ncclProfiler_v5 or ncclProfiler_v4");
    dlclose(profLib);
    profLib = NULL;
    return;
  }
  const char* n = profVersion == 5 ? profV5->name : profV4->name;
  snprintf(profName, sizeof(profName), "%s", n ? n : "(null)");
  INFO(SIM_INIT, "PROFILER/Plugin: Loaded %s (v%d)", profName, profVersion);
}

/* called with profLock held */
static void unloadLocked(void) {
  if (profRefs == 0 || --profRefs > 0) return;
  if (profLib) {
    INFO(SIM_INIT, "PROFILER/Plugin: Closing profiler plugin %s", profName);
    dlclose(profLib);
  }
  profLib = NULL;
  profV5 = NULL;
  profV4 = NULL;
  profVersion = 0;
}

void simProfilerCommInit(struct ncclComm* comm) {
  pthread_mutex_lock(&profLock);
  loadLocked();
  comm->profilerActive = 1; /* holds a reference, released at finalize */
  int version = profVersion;
  ncclProfiler_v5_t* v5 = profV5;
  ncclProfiler_v4_t* v4 = profV4;
  pthread_mutex_unlock(&profLock);
  if (!version) return;
  int mask = 0;
  void* ctx = NULL;
  const char* name = comm->commName[0] ? comm->commName : NULL;
  ncclResult_t r = version == 5
      ? v5->init(&ctx, comm->commHash, &mask, name, 1, comm->nranks, comm->rank, simLog)
      : v4->init(&ctx, &mask, name, comm->commHash, 1, comm->nranks, comm->rank, simLog);
  if (r != ncclSuccess) {
    INFO(SIM_INIT, "PROFILER/Plugin: init returned %d, profiling off for comm %p", (int)r, (void*)comm);
    return;
  }
  __atomic_store_n(&profMask, mask, __ATOMIC_RELAXED);
  comm->profilerCtx = ctx;
  comm->profilerActive = 2;
}

void simProfilerCommFinalize(struct ncclComm* comm) {
  if (!comm->profilerActive) return;
  pthread_mutex_lock(&profLock);
  if (comm->profilerActive == 2 && profVersion) {
    if (profVersion == 5 && profV5->finalize) profV5->finalize(comm->profilerCtx);
    else if (profVersion == 4 && profV4->finalize) profV4->finalize(comm->profilerCtx);
  }
  comm->profilerActive = 0;
  comm->profilerCtx = NULL;
  unloadLocked();
  pthread_mutex_unlock(&profLock);
}

/* ------------------------------------------------------------------ the simulated GPU */

uint64_t simNowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The collective's descriptor members, alike in v4 and v5 (the layouts agree up to proto). */
#define FILL_COLL(d, t)                                  \
  do {                                                   \
    (d).coll.func = "AllReduce";                         \
    (d).coll.sendBuff = (t)->sendbuff;                   \
    (d).coll.recvBuff = (t)->recvbuff;                   \
    (d).coll.count = (t)->count;                         \
    (d).coll.datatype = simDatatypeToString((t)->dt);    \
    (d).coll.nChannels = (uint8_t)(t)->nChannels;        \
    (d).coll.nWarps = (uint8_t)(t)->nWarps;              \
    (d).coll.algo = simAlgoToString((t)->algo);          \
    (d).coll.proto = simProtoToString((t)->proto);       \
  } while (0)

/* Kernel time: a latency plus the all-reduce's bus bytes (2(n-1)/n of the buffer) at 100 GB/s,
 * LL at half the bandwidth, LL128 at 90 %, Tree at 80 % of Ring. Deterministic. */
uint64_t simKernelNs(int algo, int proto, size_t nbytes, int nranks) {
  static const uint64_t latency[SIM_NUM_PROTOS] = {4000, 5000, 7000};
  static const unsigned bwPct[SIM_NUM_PROTOS] = {50, 90, 100};
  double bus = nranks > 1 ? (double)nbytes * 2.0 * (nranks - 1) / nranks : (double)nbytes;
  double bytesPerNs = 100.0 * bwPct[proto] / 100.0 * (algo == SIM_ALGO_TREE ? 0.8 : 1.0);
  return latency[proto] + (algo == SIM_ALGO_TREE ? 1000 : 0) + (uint64_t)(bus / bytesPerNs);
}

/* The kernel starts 2 us after its launch or when the comm's stream runs dry, whichever is later. */
uint64_t simGpuSchedule(struct ncclComm* comm, uint64_t dur) {
  uint64_t launch = simNowNs() + 2000, prev = __atomic_load_n(&comm->gpuFreeAt, __ATOMIC_RELAXED), start;
  do {
    start = prev > launch ? prev : launch;
  } while (!__atomic_compare_exchange_n(&comm->gpuFreeAt, &prev, start + dur + 1000, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
  return start;
}

/* ------------------------------------------------------------------ calls into the plugin */

/* NCCL ignores startEvent's result and keeps whatever handle the plugin left (NULL at first). */
static void* start5(struct ncclComm* comm, ncclProfilerEventDescr_v5_t* d) {
  void* h = NULL;
  d->rank = comm->rank;
  if (profV5->startEvent) profV5->startEvent(comm->profilerCtx, &h, d);
  return h;
}
static void* start4(struct ncclComm* comm, ncclProfilerEventDescr_v4_t* d) {
  void* h = NULL;
  d->rank = comm->rank;
  if (profV4->startEvent) profV4->startEvent(comm->profilerCtx, &h, d);
  return h;
}
/* stopEvent and recordEventState only for a non-NULL handle (every core event's wrapper tests it) */
static void stop(void* h) {
  if (!h) return;
  if (profVersion == 5 && profV5->stopEvent) profV5->stopEvent(h);
  else if (profVersion == 4 && profV4->stopEvent) profV4->stopEvent(h);
}
static void record(void* h, ncclProfilerEventState_t s, ncclProfilerEventStateArgs_v5_t* a) {
  if (!h) return;
  if (profVersion == 5 && profV5->recordEventState) profV5->recordEventState(h, s, a);
  else if (profVersion == 4 && profV4->recordEventState) profV4->recordEventState(h, s, a);
}

static int profiled(const struct ncclComm* comm) { return comm->profilerActive == 2 && profVersion; }

/* comm->seqNumber[func] is read for the Coll, then advanced unless the plan is persistent, where
 * it advances only when KernelCh adds proxy ops (ncclProfilerStartTaskEvents). */
static uint64_t nextSeq(const simTask* t, int persistent, int haveHandles) {
  struct ncclComm* c = t->comm;
  if (!persistent || (haveHandles && (t->mask & ncclProfileKernelCh)))
    return __atomic_fetch_add(&c->seqNumber, 1, __ATOMIC_RELAXED);
  return __atomic_load_n(&c->seqNumber, __ATOMIC_RELAXED);
}

/* hostStreamPlanTask: Group start, Coll start, proxy ops posted (KernelCh may start before Coll
 * stops), Coll stop, Group stop. `kstart` and `dur` place the kernel on the simulated GPU clock. */
static void planTask(const simTask* t, int persistent, uint64_t kstart, uint64_t dur) {
  struct ncclComm* comm = t->comm;
  void* group = NULL;
  void* coll = NULL;
  int collStarted = 0;
  if (profVersion == 5) {
    ncclProfilerEventDescr_v5_t d;
    if (t->mask & GROUP_GATE) {
      memset(&d, 0, sizeof(d));
      d.type = ncclProfileGroup;
      group = start5(comm, &d);
    }
    if (t->mask & TASK_GATE) {
      memset(&d, 0, sizeof(d));
      d.type = ncclProfileColl;
      d.parentObj = t->collApi;
      d.coll.seqNumber = nextSeq(t, persistent, group || t->collApi);
      FILL_COLL(d, t);
      d.coll.parentGroup = group;
      coll = start5(comm, &d);
      collStarted = 1;
    }
  } else {
    ncclProfilerEventDescr_v4_t d;
    if (t->mask & GROUP_GATE) {
      memset(&d, 0, sizeof(d));
      d.type = ncclProfileGroup;
      group = start4(comm, &d);
    }
    if (group && (t->mask & TASK_GATE)) { /* 2.27: a Coll only under a Group handle */
      memset(&d, 0, sizeof(d));
      d.type = ncclProfileColl;
      d.parentObj = group;
      d.coll.seqNumber = nextSeq(t, persistent, 1);
      FILL_COLL(d, t);
      coll = start4(comm, &d);
      collStarted = 1;
    }
  }
  if (!collStarted) nextSeq(t, persistent, 0);
  if (t->mask & ncclProfileKernelCh) { /* uploadProxyOps + ncclProxyStart */
    simWork w;
    memset(&w, 0, sizeof(w));
    w.task.comm = comm;
    w.task.mask = t->mask;
    w.task.nChannels = t->nChannels;
    w.coll = coll;
    w.kstart = kstart;
    w.dur = dur;
    simWorkPost(SIM_WORK_PROXY, &w);
  }
  stop(coll);
  stop(group);
}

int simProfilerEnqueue(simTask* t, int captured) {
  struct ncclComm* comm = t->comm;
  t->collApi = NULL;
  if (!profiled(comm)) {
    t->mask = 0;
    if (!captured) __atomic_fetch_add(&comm->seqNumber, 1, __ATOMIC_RELAXED); /* RAS counts it anyway */
    return 0;
  }
  t->mask = __atomic_load_n(&profMask, __ATOMIC_RELAXED);
  int proxyOps = (t->mask & ncclProfileKernelCh) != 0; /* the sim has no network: only KernelCh adds them */
  uint64_t dur = simKernelNs(t->algo, t->proto, t->nbytes, comm->nranks);
  void* groupApi = NULL;
  if (profVersion == 5) {
    ncclProfilerEventDescr_v5_t d;
    if (t->mask & GROUPAPI_GATE) { /* outermost group only; ncclAllReduce's own group is depth 1 */
      memset(&d, 0, sizeof(d));
      d.type = ncclProfileGroupApi;
      d.groupApi.graphCaptured = captured != 0;
      d.groupApi.groupDepth = 1;
      groupApi = start5(comm, &d);
    }
    record(groupApi, ncclProfilerGroupStartApiStop, NULL);
    if (t->mask & COLLAPI_GATE) {
      memset(&d, 0, sizeof(d));
      d.type = ncclProfileCollApi;
      d.parentObj = groupApi;
      d.collApi.func = "AllReduce";
      d.collApi.count = t->count;
      d.collApi.datatype = simDatatypeToString(t->dt);
      d.collApi.root = 0;
      d.collApi.stream = t->stream;
      d.collApi.graphCaptured = captured != 0;
      t->collApi = start5(comm, &d);
    }
    stop(t->collApi); /* NCCL keeps the handle in the task: Coll names it as its parent */
    record(groupApi, ncclProfilerGroupEndApiStart, NULL);
    if (t->mask & ncclProfileKernelLaunch) {
      memset(&d, 0, sizeof(d));
      d.type = ncclProfileKernelLaunch;
      d.parentObj = groupApi;
      d.kernelLaunch.stream = t->stream;
      stop(start5(comm, &d));
    }
  }
  int callback = captured && proxyOps;
  if (!callback) planTask(t, captured, captured ? simNowNs() : simGpuSchedule(comm, dur), dur);
  stop(groupApi);
  return callback;
}

void simProfilerReplay(const simTask* t, uint64_t kstart, uint64_t dur) {
  if (profiled(t->comm)) planTask(t, 1, kstart, dur);
}

/* profilerProxyProgress: KernelCh start when a channel's work starts, KernelChStop with the GPU's
 * stop stamp and stop when it completes. Channel c starts 25 ns after c-1 and ends 15 ns later. */
void simProfilerKernelCh(struct ncclComm* comm, void* coll, int mask, int nChannels, uint64_t kstart, uint64_t dur) {
  void* h[64];
  if (!profiled(comm) || !(mask & ncclProfileKernelCh)) return;
  if (nChannels > 64) nChannels = 64;
  for (int ch = 0; ch < nChannels; ch++) {
    uint64_t t0 = kstart + 25ull * ch;
    if (profVersion == 5) {
      ncclProfilerEventDescr_v5_t d;
      memset(&d, 0, sizeof(d));
      d.type = ncclProfileKernelCh;
      d.parentObj = coll;
      d.kernelCh.channelId = (uint8_t)ch;
      d.kernelCh.pTimer = t0;
      h[ch] = start5(comm, &d);
    } else {
      ncclProfilerEventDescr_v4_t d;
      memset(&d, 0, sizeof(d));
      d.type = ncclProfileKernelCh;
      d.parentObj = coll;
      d.kernelCh.channelId = (uint8_t)ch;
      d.kernelCh.pTimer = t0;
      h[ch] = start4(comm, &d);
    }
  }
  for (int ch = 0; ch < nChannels; ch++) {
    ncclProfilerEventStateArgs_v5_t a;
    memset(&a, 0, sizeof(a));
    a.kernelCh.pTimer = kstart + dur + 15ull * ch;
    record(h[ch], ncclProfilerKernelChStop, &a);
    stop(h[ch]);
  }
}
