/* api.c - the exported NCCL API subset of the simulated NCCL 2.28.9.
 *
 * Like NCCL (NCCL_API, src/include/core.h) every function is a strong pnccl* symbol with a weak
 * nccl* alias, so preload interposition behaves as with the real library. Communicators are created
 * locally, without bootstrap: ranks of one communicator agree on its commHash because it is derived
 * from the unique id (a split child's from its parent's hash, split index and color). A split child
 * keeps its parent's rank and size (the sim has no peers to count). Pointers that are not live
 * communicators are refused with ncclInvalidArgument instead of crashing.
 */
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sim.h"

#define NCCL_API(ret, name, ...)                      \
  SIM_API ret p##name(__VA_ARGS__);                   \
  SIM_API ret name(__VA_ARGS__) __attribute__((weak, alias("p" #name)))

/* Marker the probe library looks for: this libnccl is simulated. */
SIM_API const int ncclSimulated = 1;
SIM_API const char ncclSimVersionString[] = SIM_VERSION_LINE;

#define SIM_BASE_CHANNELS 32   /* channels the simulated topology offers before any cap */
#define SIM_CONFIG_SIZE 80     /* sizeof(ncclConfig_t) in NCCL 2.28 (ncclConfig_v22800) */
#define SIM_LL128_THREADS 640  /* NCCL_LL128_MAX_NTHREADS (src/include/device.h) */

static pthread_mutex_t commsLock = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm* liveComms;

static void registerComm(struct ncclComm* c) {
  static uint64_t nextUid;
  pthread_mutex_lock(&commsLock);
  c->uid = ++nextUid;
  c->next = liveComms;
  liveComms = c;
  pthread_mutex_unlock(&commsLock);
}

static int isLive(const struct ncclComm* c) {
  if (!c) return 0;
  pthread_mutex_lock(&commsLock);
  struct ncclComm* p = liveComms;
  while (p && p != c) p = p->next;
  pthread_mutex_unlock(&commsLock);
  return p != NULL;
}

int simCommIsLive(const struct ncclComm* comm, uint64_t uid) {
  if (!comm) return 0;
  pthread_mutex_lock(&commsLock);
  struct ncclComm* p = liveComms;
  while (p && !(p == comm && p->uid == uid)) p = p->next;
  pthread_mutex_unlock(&commsLock);
  return p != NULL;
}

static int unregisterComm(struct ncclComm* c) {
  pthread_mutex_lock(&commsLock);
  struct ncclComm** pp = &liveComms;
  while (*pp && *pp != c) pp = &(*pp)->next;
  int found = *pp != NULL;
  if (found) *pp = c->next;
  pthread_mutex_unlock(&commsLock);
  return found;
}

static uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
  const unsigned char* p = (const unsigned char*)data;
  for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 0x100000001b3ull; }
  return h;
}
#define FNV_OFFSET 0xcbf29ce484222325ull

static size_t typeSize(ncclDataType_t dt) {
  switch (dt) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

const char* simDatatypeToString(ncclDataType_t dt) {
  static const char* s[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
                            "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
                            "ncclFloat8e5m2"};
  return (dt >= 0 && dt < ncclNumTypes) ? s[dt] : "Unknown";
}

static void showVersion(void) {
  if (simDebugLevel() <= NCCL_LOG_WARN) simLog(NCCL_LOG_VERSION, SIM_ALL, __FILE__, __LINE__, "%s", SIM_VERSION_LINE);
  else INFO(SIM_ALL, "%s", SIM_VERSION_LINE);
}

/* ncclCommInitRankDev: shown above WARN, or at WARN/VERSION by rank 0 only; once per process */
static void showVersionOnce(int rank) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  int level = simDebugLevel();
  if (level > NCCL_LOG_WARN || (level != NCCL_LOG_NONE && rank == 0)) pthread_once(&once, showVersion);
}

/* ------------------------------------------------------------------ version, ids, errors */

NCCL_API(ncclResult_t, ncclGetVersion, int* version);
ncclResult_t pncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = SIM_VERSION_CODE;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId* uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId) {
  simInitEnv();
  if (!uniqueId) {
    WARN("ncclGetUniqueId : uniqueId argument is NULL");
    return ncclInvalidArgument;
  }
  const char* commIdEnv = simGetEnv("NCCL_COMM_ID");
  if (commIdEnv) INFO(SIM_ENV, "NCCL_COMM_ID set by environment to %s", commIdEnv);
  static uint64_t counter;
  memset(uniqueId, 0, sizeof(*uniqueId));
  memcpy(uniqueId->internal, "SIMNCCL", 7);
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  ssize_t got = fd >= 0 ? read(fd, uniqueId->internal + 8, 32) : -1;
  if (fd >= 0) close(fd);
  if (got != 32) { /* no urandom: time, pid and a counter still differ per call */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t v[4] = {(uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec, (uint64_t)getpid(),
                     __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED)};
    memcpy(uniqueId->internal + 8, v, sizeof(v));
  }
  return ncclSuccess;
}

NCCL_API(const char*, ncclGetErrorString, ncclResult_t result);
const char* pncclGetErrorString(ncclResult_t code) {
  switch (code) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

NCCL_API(const char*, ncclGetLastError, ncclComm_t comm);
const char* pncclGetLastError(ncclComm_t comm) { return simLastError(); }

/* ------------------------------------------------------------------ communicator creation */

static void resetUnknownFields(ncclConfig_t* c, size_t size, unsigned version) {
  /* parseCommConfig: fields past the caller's size, newer than its version, or unknown to 2.28 */
#define RESET_INT(f) c->f = NCCL_CONFIG_UNDEF_INT
#define RESET_STR(f) c->f = NULL
#define X(f, kind, since)                                                                        \
  if (offsetof(ncclConfig_t, f) + sizeof(c->f) > size || version < (unsigned)(since) ||         \
      offsetof(ncclConfig_t, f) + sizeof(c->f) > SIM_CONFIG_SIZE)                               \
    RESET_##kind(f);
  NCCL_ABI_CONFIG_FIELDS(X)
#undef X
#undef RESET_INT
#undef RESET_STR
}

static void undefConfig(ncclConfig_t* c) {
  memset(c, 0, sizeof(*c));
  c->size = sizeof(*c);
  c->magic = NCCL_API_MAGIC;
  c->version = SIM_VERSION_CODE;
  resetUnknownFields(c, 0, 0);
}

static ncclResult_t parseConfig(const ncclConfig_t* in, ncclConfig_t* out) {
  /* `size` first: magic and version lie past it in a config smaller than the header. */
  if (in->size < offsetof(ncclConfig_t, blocking) || in->magic != NCCL_API_MAGIC) {
    if (in->size < offsetof(ncclConfig_t, blocking))
      WARN("Invalid config: size %zu (use NCCL_CONFIG_INITIALIZER)", in->size);
    else
      WARN("Invalid config: magic 0x%x size %zu (use NCCL_CONFIG_INITIALIZER)", in->magic, in->size);
    return ncclInvalidArgument;
  }
  size_t n = in->size < SIM_CONFIG_SIZE ? in->size : SIM_CONFIG_SIZE;
  undefConfig(out);
  memcpy(out, in, n);
  resetUnknownFields(out, n, in->version);
  /* NCCL_CONFIG_DEFAULT logs the fields the caller set */
#define LOG_INT(f) if (out->f != NCCL_CONFIG_UNDEF_INT) INFO(SIM_ENV, "Comm config " #f " set to %d", out->f);
#define LOG_STR(f) if (out->f) INFO(SIM_ENV, "Comm config " #f " set to %s", out->f);
#define X(f, kind, since) LOG_##kind(f)
  NCCL_ABI_CONFIG_FIELDS(X)
#undef X
#undef LOG_INT
#undef LOG_STR
  return ncclSuccess;
}

/* envConfigOverride (src/init.cc): cached NCCL_PARAMs win over the caller's config at every init */
static void envConfigOverride(ncclConfig_t* c) {
  int64_t v = simParamGet(&simParamCommBlocking);
  if (v == 0 || v == 1) c->blocking = (int)v;
  v = simParamGet(&simParamCGAClusterSize);
  if (v >= 0 && v <= 8) {
    if (c->cgaClusterSize != NCCL_CONFIG_UNDEF_INT)
      INFO(SIM_ENV, "Comm config cgaClusterSize reset to NCCL_MAX_CGA_CLUSTER_SIZE=%d", (int)v);
    c->cgaClusterSize = (int)v;
  }
  v = simParamGet(&simParamMinCTAs);
  if (v != NCCL_CONFIG_UNDEF_INT && v > 0) {
    if (c->minCTAs != NCCL_CONFIG_UNDEF_INT) INFO(SIM_ENV, "Comm config minCTAs reset to NCCL_MIN_CTAS=%d", (int)v);
    c->minCTAs = (int)v;
  }
  v = simParamGet(&simParamMaxCTAs);
  if (v != NCCL_CONFIG_UNDEF_INT && v > 0) {
    if (c->maxCTAs != NCCL_CONFIG_UNDEF_INT) INFO(SIM_ENV, "Comm config maxCTAs reset to NCCL_MAX_CTAS=%d", (int)v);
    c->maxCTAs = (int)v;
  }
  const char* net = simGetEnv("NCCL_NET"); /* read at every init */
  if (net && c->netName) INFO(SIM_ENV, "Comm config netName reset to NCCL_NET=%s", net);
  c->netName = NULL; /* the caller's string is not ours to keep; the sim has one (absent) network */
  v = simParamGet(&simParamSplitShare);
  if (v == 0 || v == 1) {
    if (c->splitShare != NCCL_CONFIG_UNDEF_INT)
      INFO(SIM_ENV, "Comm config splitShare reset to NCCL_COMM_SPLIT_SHARE_RESOURCES=%d", (int)v);
    c->splitShare = (int)v;
  }
  /* NCCL_COLLNET_ENABLE "needs to be reloaded each time for comm init" (2.27.5+) */
  const char* collnet = simGetEnv("NCCL_COLLNET_ENABLE");
  if (collnet) {
    int on = (int)strtol(collnet, NULL, 0);
    if (on != NCCL_CONFIG_UNDEF_INT) {
      if (c->collnetEnable != NCCL_CONFIG_UNDEF_INT)
        INFO(SIM_ENV, "Comm config collnetEnable reset to NCCL_COLLNET_ENABLE=%d", on);
      c->collnetEnable = on;
      INFO(SIM_ENV, "NCCL_COLLNET_ENABLE set by environment to %d.", on);
    }
  }
  v = simParamGet(&simParamCtaPolicy);
  if (v != NCCL_CONFIG_UNDEF_INT) {
    if (c->CTAPolicy != NCCL_CONFIG_UNDEF_INT) INFO(SIM_ENV, "Comm config CTAPolicy reset to NCCL_CTA_POLICY=%d", (int)v);
    c->CTAPolicy = (int)v;
  }
  v = simParamGet(&simParamNvlsChannels);
  if (v != NCCL_CONFIG_UNDEF_INT) {
    if (c->nvlsCTAs != NCCL_CONFIG_UNDEF_INT) INFO(SIM_ENV, "Comm config nvlsCTAs reset to NCCL_NVLS_NCHANNELS=%d", (int)v);
    c->nvlsCTAs = (int)v;
  }
  if (c->blocking == NCCL_CONFIG_UNDEF_INT) c->blocking = 1;
  if (c->minCTAs == NCCL_CONFIG_UNDEF_INT) c->minCTAs = 1;
  if (c->maxCTAs == NCCL_CONFIG_UNDEF_INT) c->maxCTAs = 64;
}

static int clampInt(int64_t v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : (int)v; }

static ncclResult_t commInit(ncclComm_t* out, int nranks, uint64_t hash, int rank, int dev, const ncclConfig_t* config,
                             const char* api, struct ncclComm* parent, int color, int key) {
  simInitEnv();
  showVersionOnce(rank);
  if (!out) {
    WARN("%s : newcomm argument is NULL", api);
    return ncclInvalidArgument;
  }
  *out = NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    WARN("Invalid rank requested : %d/%d", rank, nranks);
    return ncclInvalidArgument;
  }
  struct ncclComm* c = (struct ncclComm*)calloc(1, sizeof(*c));
  if (!c) return ncclSystemError;
  c->magic = SIM_COMM_MAGIC;
  c->rank = rank;
  c->nranks = nranks;
  c->cudaDev = dev;
  c->commHash = hash;
  c->parent = parent;
  c->api = api;
  ncclResult_t r = ncclSuccess;
  if (config) r = parseConfig(config, &c->config);
  else if (parent) { /* ncclCommSplit: a NULL config inherits the parent's, name included */
    c->config = parent->config;
    memcpy(c->commName, parent->commName, sizeof(c->commName));
  }
  else undefConfig(&c->config);
  if (r != ncclSuccess) { free(c); return r; }
  if (c->config.commName) snprintf(c->commName, sizeof(c->commName), "%s", c->config.commName);
  c->config.commName = NULL; /* the caller's string is not ours to keep */
  simSetThreadDev(dev);
  long busId = (long)(dev + 1) << 12;
  if (parent)
    INFO(SIM_INIT, "%s comm %p rank %d nranks %d cudaDev %d nvmlDev %d busId %lx parent %p splitCount %d color %d "
         "key %d- Init START", api, (void*)c, rank, nranks, dev, dev, busId, (void*)parent, parent->childCount, color, key);
  else
    INFO(SIM_INIT, "%s comm %p rank %d nranks %d cudaDev %d nvmlDev %d busId %lx commId 0x%llx - Init START", api,
         (void*)c, rank, nranks, dev, dev, busId, (unsigned long long)hash);
  envConfigOverride(&c->config);
  simReadProcessParams();
  INFO(SIM_INIT, "comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d MNNVL %d", (void*)c, rank, nranks, 1,
       nranks, rank, 0);
  r = simTuneComm(&c->tuning);
  if (r != ncclSuccess) { free(c); return r; }
  int64_t ch = SIM_BASE_CHANNELS, minCh = simParamGet(&simParamMinNchannels), maxCh = simParamGet(&simParamMaxNchannels);
  if (minCh != -2 && ch < minCh) ch = minCh;
  if (maxCh != -2 && ch > maxCh) ch = maxCh;
  ch = clampInt(ch, c->config.minCTAs, c->config.maxCTAs);
  c->nChannels = clampInt(ch, 1, 64);
  INFO(SIM_INIT, "%d coll channels, %d collnet channels, %d nvls channels, %d p2p channels, %d p2p channels per peer",
       c->nChannels, c->nChannels, 0, c->nChannels, 2);
  registerComm(c);
  simProfilerCommInit(c);
  if (parent)
    INFO(SIM_INIT, "%s comm %p rank %d nranks %d cudaDev %d nvmlDev %d busId %lx parent %p splitCount %d color %d "
         "key %d - Init COMPLETE", api, (void*)c, rank, nranks, dev, dev, busId, (void*)parent, parent->childCount,
         color, key);
  else
    INFO(SIM_INIT, "%s comm %p rank %d nranks %d cudaDev %d nvmlDev %d busId %lx commId 0x%llx - Init COMPLETE", api,
         (void*)c, rank, nranks, dev, dev, busId, (unsigned long long)hash);
  *out = c;
  return ncclSuccess;
}

static uint64_t idHash(const ncclUniqueId* id) { return fnv1a(id->internal, NCCL_UNIQUE_ID_BYTES, FNV_OFFSET); }

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t* newcomm, int nranks, ncclUniqueId commId, int myrank);
ncclResult_t pncclCommInitRank(ncclComm_t* newcomm, int nranks, ncclUniqueId commId, int myrank) {
  return commInit(newcomm, nranks, idHash(&commId), myrank, myrank, NULL, "ncclCommInitRank", NULL, 0, 0);
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t* comm, int nranks, ncclUniqueId commId, int myrank,
         ncclConfig_t* config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int myrank,
                                     ncclConfig_t* config) {
  return commInit(comm, nranks, idHash(&commId), myrank, myrank, config, "ncclCommInitRankConfig", NULL, 0, 0);
}

NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t* comms, int ndev, const int* devlist);
ncclResult_t pncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  simInitEnv();
  if (!comms || ndev < 1) {
    WARN("ncclCommInitAll : invalid arguments (comms %p, ndev %d)", (void*)comms, ndev);
    return ncclInvalidArgument;
  }
  for (int i = 0; devlist && i < ndev; i++)
    if (devlist[i] < 0) {
      WARN("ncclCommInitAll : invalid device %d", devlist[i]);
      return ncclInvalidArgument;
    }
  ncclUniqueId id;
  ncclResult_t r = pncclGetUniqueId(&id);
  for (int i = 0; r == ncclSuccess && i < ndev; i++)
    r = commInit(&comms[i], ndev, idHash(&id), i, devlist ? devlist[i] : i, NULL, "ncclCommInitAll", NULL, 0, 0);
  if (r != ncclSuccess) {
    for (int i = 0; i < ndev; i++) {
      if (comms[i] && unregisterComm(comms[i])) {
        simProfilerCommFinalize(comms[i]);
        free(comms[i]);
      }
      comms[i] = NULL;
    }
  }
  return r;
}

NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (!isLive(comm) || !newcomm) {
    WARN("ncclCommSplit : invalid communicator %p or newcomm %p", (void*)comm, (void*)newcomm);
    return ncclInvalidArgument;
  }
  *newcomm = NULL;
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess; /* this rank joins no child */
  if (color < 0) {
    WARN("ncclCommSplit : invalid color %d", color);
    return ncclInvalidArgument;
  }
  int idx = __atomic_add_fetch(&comm->childCount, 1, __ATOMIC_RELAXED);
  uint64_t mix[3] = {comm->commHash, (uint64_t)idx, (uint64_t)(uint32_t)color};
  return commInit(newcomm, comm->nranks, fnv1a(mix, sizeof(mix), FNV_OFFSET), comm->rank, comm->cudaDev, config,
                  "ncclCommSplit", comm, color, key);
}

/* ------------------------------------------------------------------ queries, teardown */

static ncclResult_t query(const ncclComm_t comm, int* out, const char* what) {
  if (!isLive(comm) || !out) {
    WARN("%s : invalid communicator %p or output %p", what, (void*)comm, (void*)out);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int* count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  ncclResult_t r = query(comm, count, "ncclCommCount");
  if (r == ncclSuccess) *count = comm->nranks;
  return r;
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int* rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  ncclResult_t r = query(comm, rank, "ncclCommUserRank");
  if (r == ncclSuccess) *rank = comm->rank;
  return r;
}

NCCL_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int* device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  ncclResult_t r = query(comm, device, "ncclCommCuDevice");
  if (r == ncclSuccess) *device = comm->cudaDev;
  return r;
}

NCCL_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  if (!isLive(comm)) {
    WARN("ncclCommFinalize : invalid communicator %p", (void*)comm);
    return ncclInvalidArgument;
  }
  comm->finalized = 1;
  return ncclSuccess;
}

static ncclResult_t teardown(ncclComm_t comm, int abort) {
  if (comm == NULL) return ncclSuccess; /* NCCL: destroying or aborting NULL is a no-op */
  if (!unregisterComm(comm)) {
    WARN("%s : invalid communicator %p", abort ? "ncclCommAbort" : "ncclCommDestroy", (void*)comm);
    return ncclInvalidArgument;
  }
  /* the plugin context outlives every event queued for it; the last comm takes the threads along */
  simWorkDrainComm(comm);
  pthread_mutex_lock(&commsLock);
  int last = liveComms == NULL;
  pthread_mutex_unlock(&commsLock);
  if (last) {
    simWorkStop();
    simGraphsFreeAll();
  }
  simProfilerCommFinalize(comm);
  INFO(SIM_INIT, "comm %p rank %d nranks %d cudaDev %d busId %lx - %s COMPLETE", (void*)comm, comm->rank,
       comm->nranks, comm->cudaDev, (long)(comm->cudaDev + 1) << 12, abort ? "Abort" : "Destroy");
  comm->magic = 0;
  free(comm);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm) { return teardown(comm, 0); }

NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm) { return teardown(comm, 1); }

/* ------------------------------------------------------------------ all-reduce */

NCCL_API(ncclResult_t, ncclAllReduce, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
         ncclRedOp_t op, ncclComm_t comm, void* stream);
ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                            ncclRedOp_t op, ncclComm_t comm, void* stream) {
  if (!isLive(comm)) {
    WARN("AllReduce : invalid communicator %p", (void*)comm);
    return ncclInvalidArgument;
  }
  size_t ts = typeSize(datatype);
  if (ts == 0 || (int)op < 0 || op >= ncclNumOps) {
    WARN("AllReduce : invalid type %d or op %d", (int)datatype, (int)op);
    return ncclInvalidArgument;
  }
  if (count > SIZE_MAX / ts || (count > 0 && (!sendbuff || !recvbuff))) {
    WARN("AllReduce : invalid count %zu or NULL buffer (send %p recv %p)", count, sendbuff, recvbuff);
    return ncclInvalidArgument;
  }
  if (comm->finalized) {
    WARN("AllReduce : communicator %p is finalized", (void*)comm);
    return ncclInvalidUsage;
  }
  size_t nbytes = count * ts;
  simSetThreadDev(comm->cudaDev);
  void* graph = simCaptureGraph(stream); /* a capturing stream records instead of running */
  simTask t = {.comm = comm, .sendbuff = sendbuff, .recvbuff = recvbuff, .count = count, .nbytes = nbytes,
               .dt = datatype, .stream = stream};
  if (comm->nranks > 1 && count > 0) {
    /* a single rank takes NCCL's shortcut: no algorithm, no TUNING line, no profiler event */
    int algo, proto;
    ncclResult_t r = simPick(&comm->tuning, SIM_FUNC_ALLREDUCE, nbytes, &algo, &proto);
    if (r != ncclSuccess) return r;
    int64_t threads = proto == SIM_PROTO_LL128 ? simParamGet(&simParamLl128Nthreads) : simParamGet(&simParamNthreads);
    if (threads <= 0) threads = proto == SIM_PROTO_LL128 ? SIM_LL128_THREADS : 512;
    t.algo = algo;
    t.proto = proto;
    t.nChannels = comm->nChannels;
    t.nWarps = clampInt(threads / 32, 1, 255);
    if (comm->rank == 0)
      INFO(SIM_TUNING, "%s: %ld Bytes -> Algo %s proto %s channel{Lo..Hi}={%d..%d}", "AllReduce", (long)nbytes,
           simAlgoToString(algo), simProtoToString(proto), 0, comm->nChannels - 1);
    if (graph) {
      ncclResult_t rec = simGraphReserve(graph); /* room in the graph before any event fires */
      if (rec != ncclSuccess) return rec;
      int replayEvents = simProfilerEnqueue(&t, 1);
      return simGraphRecord(graph, &t, replayEvents);
    }
    simProfilerEnqueue(&t, 0);
  } else if (graph) {
    return count > 0 ? simGraphRecord(graph, &t, 0) : ncclSuccess; /* ncclLaunchOneRank: a copy in the graph */
  }
  /* simulated: no peers to reduce with, the result is this rank's own data */
  if (nbytes && sendbuff != recvbuff) memmove(recvbuff, sendbuff, nbytes);
  return ncclSuccess;
}
