/* profiler.c - NCCL_PROFILER_PLUGIN through the real ABI, as NCCL 2.28.9 drives it
 * (src/plugin/profiler.cc): the library loads with the first communicator (refcounted) and closes
 * with the last; "ncclProfiler_v5" is looked up first, then "ncclProfiler_v4"; init runs per
 * communicator with its commHash; one collective event (start, stop) per all-reduce carries the
 * algorithm, protocol and channels the simulated NCCL picked; finalize runs at destroy.
 */
#include <dlfcn.h>
#include <limits.h>
#include <string.h>
#include <strings.h>

#include "sim.h"

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

void simProfilerColl(struct ncclComm* comm, const void* sendbuff, void* recvbuff, size_t count,
                     ncclDataType_t dt, int algo, int proto, int nChannels, int nWarps) {
  if (comm->profilerActive != 2 || !(__atomic_load_n(&profMask, __ATOMIC_RELAXED) & ncclProfileColl)) return;
  void* handle = NULL;
  if (profVersion == 5 && profV5->startEvent) {
    ncclProfilerEventDescr_v5_t d;
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileColl;
    d.rank = comm->rank;
    d.coll.seqNumber = comm->seq;
    d.coll.func = "AllReduce";
    d.coll.sendBuff = sendbuff;
    d.coll.recvBuff = recvbuff;
    d.coll.count = count;
    d.coll.datatype = simDatatypeToString(dt);
    d.coll.nChannels = (uint8_t)nChannels;
    d.coll.nWarps = (uint8_t)nWarps;
    d.coll.algo = simAlgoToString(algo);
    d.coll.proto = simProtoToString(proto);
    if (profV5->startEvent(comm->profilerCtx, &handle, &d) == ncclSuccess && handle && profV5->stopEvent)
      profV5->stopEvent(handle);
  } else if (profVersion == 4 && profV4->startEvent) {
    ncclProfilerEventDescr_v4_t d;
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileColl;
    d.rank = comm->rank;
    d.coll.seqNumber = comm->seq;
    d.coll.func = "AllReduce";
    d.coll.sendBuff = sendbuff;
    d.coll.recvBuff = recvbuff;
    d.coll.count = count;
    d.coll.datatype = simDatatypeToString(dt);
    d.coll.nChannels = (uint8_t)nChannels;
    d.coll.nWarps = (uint8_t)nWarps;
    d.coll.algo = simAlgoToString(algo);
    d.coll.proto = simProtoToString(proto);
    if (profV4->startEvent(comm->profilerCtx, &handle, &d) == ncclSuccess && handle && profV4->stopEvent)
      profV4->stopEvent(handle);
  }
}
