/* nccl_abi.h - the parts of NCCL's binary interface that ncclprobe's probes (and the simulated NCCL)
 * need, declared here so that nothing is built against nccl.h or CUDA. Self-contained C11, LP64.
 *
 * Every layout below was checked field by field against NVIDIA/nccl's own headers:
 *   src/nccl.h.in                               v2.18.1-1 .. v2.30.7-1, 2.31.2 (commit 88980683)
 *   include/nccl.h of the nvidia-nccl-cu12 2.32.3 wheel (ncclConfig_v23200 layout, ncclTimeout)
 *   src/include/nccl_common.h                   ncclDebugLogger_t (same in v2.27.3-1 .. v2.30.7-1)
 *   src/include/plugin/nccl_profiler.h          event type bits, event states
 *   src/include/plugin/profiler/profiler_v4..6.h  v2.27.3-1, v2.28.7-1, v2.29.7-1, v2.30.7-1 (no
 *                                               layout change across those tags)
 *   src/include/plugin/profiler/profiler_v7.h   2.31.2 (commit 88980683; the 2.32.3 library exports
 *                                               ncclProfiler_v7, its header is not public yet)
 *   src/include/plugin/env/env_v1.h             v2.28.7-1 .. v2.30.7-1
 *   src/include/plugin/env/env_v2.h             v2.30.7-1
 * The _Static_asserts at the end pin the offsets that code reads through these declarations.
 */
#ifndef NCCLPROBE_NCCL_ABI_H
#define NCCLPROBE_NCCL_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* NCCL_VERSION() of src/nccl.h.in: 2.8 and older used a 3-digit minor encoding. */
#define NCCL_ABI_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

/* ---------------------------------------------------------------- core types (src/nccl.h.in) */

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8, /* 2.32 */
  ncclNumResults = 9
} ncclResult_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

typedef struct ncclComm* ncclComm_t;

typedef enum {
  ncclInt8 = 0, ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2, ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, ncclHalf = 6,
  ncclFloat32 = 7, ncclFloat = 7,
  ncclFloat64 = 8, ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5 } ncclRedOp_t;

#define NCCL_SPLIT_NOCOLOR (-1)
#define NCCL_API_MAGIC 0xcafebeefu
#define NCCL_CONFIG_UNDEF_INT INT32_MIN

/* ncclConfig_t, newest layout (ncclConfig_v23200 of the 2.32.3 wheel). The struct is append-only:
 * a caller compiled against an older nccl.h passes a smaller `size` and its own `version`, and
 * NCCL resets every field newer than `version` (parseCommConfig, src/init.cc). Read a caller's
 * config only through NCCL_ABI_CONFIG_FIELDS: a field is meaningful when its end fits in `size`
 * and the caller's version is at least the field's `since`. */
typedef struct {
  size_t size;          /* offset 0 */
  unsigned int magic;   /* 8: NCCL_API_MAGIC */
  unsigned int version; /* 12: the caller's compile-time NCCL_VERSION_CODE */
  int blocking;         /* 16 */
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;  /* 32 */
  int splitShare;       /* 40 */
  int trafficClass;     /* 44 */
  const char* commName; /* 48 */
  int collnetEnable;    /* 56 */
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer; /* 72 */
  int nvlinkCentricSched;
  int graphUsageMode;      /* 80 */
  int numRmaCtx;
  int maxP2pPeers;         /* 88 */
  int graphStreamOrdering;
  int launchOrderImplicit; /* 96 */
  int numRmaSig;
  int rmaEagerInit;
  int hostCftMode;
  int nvlsHostMode;        /* 112 */
} ncclConfig_t;

/* X(field, kind, since): kind is INT or STR; `since` is the caller version from which NCCL keeps
 * the field: the version parseCommConfig resets it below (v2.30.7-1 src/init.cc), or, for fields it
 * gates by size only (splitShare, commName) and for 2.31/2.32 fields, the release whose nccl.h
 * appended it (v2.18.1-1, v2.27.3-1, 2.31.2, the 2.32.3 wheel). */
#define NCCL_ABI_CONFIG_FIELDS(X)                                  \
  X(blocking, INT, NCCL_ABI_VERSION(2, 14, 0))                     \
  X(cgaClusterSize, INT, NCCL_ABI_VERSION(2, 17, 0))               \
  X(minCTAs, INT, NCCL_ABI_VERSION(2, 17, 0))                      \
  X(maxCTAs, INT, NCCL_ABI_VERSION(2, 17, 0))                      \
  X(netName, STR, NCCL_ABI_VERSION(2, 17, 0))                      \
  X(splitShare, INT, NCCL_ABI_VERSION(2, 18, 0))                   \
  X(trafficClass, INT, NCCL_ABI_VERSION(2, 25, 0))                 \
  X(commName, STR, NCCL_ABI_VERSION(2, 27, 0))                     \
  X(collnetEnable, INT, NCCL_ABI_VERSION(2, 27, 0))                \
  X(CTAPolicy, INT, NCCL_ABI_VERSION(2, 27, 0))                    \
  X(shrinkShare, INT, NCCL_ABI_VERSION(2, 27, 0))                  \
  X(nvlsCTAs, INT, NCCL_ABI_VERSION(2, 27, 0))                     \
  X(nChannelsPerNetPeer, INT, NCCL_ABI_VERSION(2, 28, 0))          \
  X(nvlinkCentricSched, INT, NCCL_ABI_VERSION(2, 28, 0))           \
  X(graphUsageMode, INT, NCCL_ABI_VERSION(2, 29, 0))               \
  X(numRmaCtx, INT, NCCL_ABI_VERSION(2, 29, 0))                    \
  X(maxP2pPeers, INT, NCCL_ABI_VERSION(2, 30, 0))                  \
  X(graphStreamOrdering, INT, NCCL_ABI_VERSION(2, 30, 5))          \
  X(launchOrderImplicit, INT, NCCL_ABI_VERSION(2, 31, 0))          \
  X(numRmaSig, INT, NCCL_ABI_VERSION(2, 31, 0))                    \
  X(rmaEagerInit, INT, NCCL_ABI_VERSION(2, 31, 0))                 \
  X(hostCftMode, INT, NCCL_ABI_VERSION(2, 31, 0))                  \
  X(nvlsHostMode, INT, NCCL_ABI_VERSION(2, 32, 0))

/* ---------------------------------------------------------------- API entry points */

typedef ncclResult_t (*ncclGetVersion_fn)(int* version);
typedef ncclResult_t (*ncclGetUniqueId_fn)(ncclUniqueId* uniqueId);
typedef ncclResult_t (*ncclCommInitRank_fn)(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
typedef ncclResult_t (*ncclCommInitRankConfig_fn)(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                                  ncclConfig_t* config);
typedef ncclResult_t (*ncclCommInitAll_fn)(ncclComm_t* comm, int ndev, const int* devlist);
typedef ncclResult_t (*ncclCommInitRankScalable_fn)(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                    ncclUniqueId* commIds, ncclConfig_t* config);
typedef ncclResult_t (*ncclCommSplit_fn)(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                         ncclConfig_t* config);
typedef ncclResult_t (*ncclCommShrink_fn)(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                          ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
typedef ncclResult_t (*ncclCommGrow_fn)(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                                        ncclComm_t* newcomm, ncclConfig_t* config);
typedef ncclResult_t (*ncclCommFinalize_fn)(ncclComm_t comm); /* also Destroy, Abort */
typedef ncclResult_t (*ncclCommQuery_fn)(const ncclComm_t comm, int* out); /* Count, CuDevice, UserRank */

/* ---------------------------------------------------------------- debug logger (nccl_common.h) */

typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

#define NCCL_ABI_LOG_INIT 0x1ul
#define NCCL_ABI_LOG_ENV 0x80ul

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);

/* ---------------------------------------------------------------- profiler plugin */

enum {
  ncclProfileGroup = (1 << 0),
  ncclProfileColl = (1 << 1),
  ncclProfileP2p = (1 << 2),
  ncclProfileProxyOp = (1 << 3),
  ncclProfileProxyStep = (1 << 4),
  ncclProfileProxyCtrl = (1 << 5),
  ncclProfileKernelCh = (1 << 6),
  ncclProfileNetPlugin = (1 << 7),
  ncclProfileGroupApi = (1 << 8),      /* v5 */
  ncclProfileCollApi = (1 << 9),       /* v5 */
  ncclProfileP2pApi = (1 << 10),       /* v5 */
  ncclProfileKernelLaunch = (1 << 11), /* v5 */
  ncclProfileCeColl = (1 << 12),       /* v6 */
  ncclProfileCeSync = (1 << 13),       /* v6 */
  ncclProfileCeBatch = (1 << 14),      /* v6 */
  ncclProfileKernelPhase = (1 << 15)   /* v7 */
};

/* ncclProfilerEventState_t: one plain enum shared by every plugin version. */
typedef enum {
  ncclProfilerProxyOpSendPosted = 0,
  ncclProfilerProxyOpSendRemFifoWait = 1,
  ncclProfilerProxyOpSendTransmitted = 2,
  ncclProfilerProxyOpSendDone = 3,
  ncclProfilerProxyOpRecvPosted = 4,
  ncclProfilerProxyOpRecvReceived = 5,
  ncclProfilerProxyOpRecvTransmitted = 6,
  ncclProfilerProxyOpRecvDone = 7,
  ncclProfilerProxyStepSendGPUWait = 8,
  ncclProfilerProxyStepSendWait = 9,
  ncclProfilerProxyStepRecvWait = 10,
  ncclProfilerProxyStepRecvFlushWait = 11,
  ncclProfilerProxyStepRecvGPUWait = 12,
  ncclProfilerProxyCtrlIdle = 13,
  ncclProfilerProxyCtrlActive = 14,
  ncclProfilerProxyCtrlSleep = 15,
  ncclProfilerProxyCtrlWakeup = 16,
  ncclProfilerProxyCtrlAppend = 17,
  ncclProfilerProxyCtrlAppendEnd = 18,
  ncclProfilerProxyOpInProgress_v4 = 19,
  ncclProfilerProxyStepSendPeerWait_v4 = 20,
  ncclProfilerNetPluginUpdate = 21,
  ncclProfilerKernelChStop = 22,
  ncclProfilerGroupStartApiStop = 23,
  ncclProfilerGroupEndApiStart = 24,
  ncclProfilerCeCollStart = 25,
  ncclProfilerCeCollComplete = 26,
  ncclProfilerCeSyncStart = 27,
  ncclProfilerCeSyncComplete = 28,
  ncclProfilerCeBatchStart = 29,
  ncclProfilerCeBatchComplete = 30,
  ncclProfilerKernelPhaseStop = 31 /* v7 */
} ncclProfilerEventState_t;

/* Per-version union members shared verbatim by several versions. */
#define NCCL_ABI_PROFILER_PROXY_MEMBERS \
  struct {                              \
    pid_t pid;                          \
    uint8_t channelId;                  \
    int peer;                           \
    int nSteps;                         \
    int chunkSize;                      \
    int isSend;                         \
  } proxyOp;                            \
  struct {                              \
    int step;                           \
  } proxyStep;                          \
  struct {                              \
    uint8_t channelId;                  \
    uint64_t pTimer;                    \
  } kernelCh;                           \
  struct {                              \
    int64_t id;                         \
    void* data;                         \
  } netPlugin;

typedef union {
  struct { size_t transSize; } proxyStep;
  struct { int appendedProxyOps; } proxyCtrl;
  struct { void* data; } netPlugin;
  struct { uint64_t pTimer; } kernelCh;
} ncclProfilerEventStateArgs_v4_t;
/* v5, v6 and v7 reuse the v4 state-argument union unchanged (v7 shares kernelCh for KernelPhase). */
typedef ncclProfilerEventStateArgs_v4_t ncclProfilerEventStateArgs_v5_t;
typedef ncclProfilerEventStateArgs_v4_t ncclProfilerEventStateArgs_v6_t;
typedef ncclProfilerEventStateArgs_v4_t ncclProfilerEventStateArgs_v7_t;

/* v4 (NCCL 2.27): uint8_t type; no API events; init takes the mask before the name and hash. */
typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
    } p2p;
    NCCL_ABI_PROFILER_PROXY_MEMBERS
  };
} ncclProfilerEventDescr_v4_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask, const char* commName, uint64_t commHash, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v4_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_t eState,
                                   ncclProfilerEventStateArgs_v4_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v4_t;

/* v5 (NCCL 2.28): uint64_t type, API events, parentGroup; init takes commId second. */
#define NCCL_ABI_PROFILER_V5_API_MEMBERS \
  struct {                               \
    bool graphCaptured;                  \
    int groupDepth;                      \
  } groupApi;                            \
  struct {                               \
    void* stream;                        \
  } kernelLaunch;

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    NCCL_ABI_PROFILER_V5_API_MEMBERS
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;
    } p2p;
    NCCL_ABI_PROFILER_PROXY_MEMBERS
  };
} ncclProfilerEventDescr_v5_t;

/* v6 (NCCL 2.29): v5 plus the copy-engine events. */
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    NCCL_ABI_PROFILER_V5_API_MEMBERS
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;
    } p2p;
    NCCL_ABI_PROFILER_PROXY_MEMBERS
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      const char* syncStrategy;
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void* stream;
    } ceColl;
    struct {
      bool isComplete;
      int nRanks;
    } ceCollSync;
    struct {
      int numOps;
      size_t totalBytes;
      bool useIntraSync;
    } ceCollBatch;
  };
} ncclProfilerEventDescr_v6_t;

/* v7 (NCCL 2.31/2.32): v6 plus userTag on API/coll/p2p/ceColl, kernelVariant and isSymColl on coll,
 * and the kernel-phase sub-event. */
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    NCCL_ABI_PROFILER_V5_API_MEMBERS
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
      uint64_t userTag;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
      uint64_t userTag;
    } p2pApi;
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;
      const char* kernelVariant;
      bool isSymColl;
      uint64_t userTag;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;
      uint64_t userTag;
    } p2p;
    NCCL_ABI_PROFILER_PROXY_MEMBERS
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      const char* syncStrategy;
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void* stream;
      uint64_t userTag;
    } ceColl;
    struct {
      bool isComplete;
      int nRanks;
    } ceCollSync;
    struct {
      int numOps;
      size_t totalBytes;
      bool useIntraSync;
    } ceCollBatch;
    struct {
      uint8_t channelId;
      uint8_t phaseId;
      const char* phaseName;
      uint64_t pTimer;
    } kernelPhase;
  };
} ncclProfilerEventDescr_v7_t;

/* v5, v6 and v7 share one init signature: (ctx, commId, mask, commName, nNodes, nranks, rank, logfn). */
#define NCCL_ABI_PROFILER_STRUCT(V)                                                                     \
  typedef struct {                                                                                      \
    const char* name;                                                                                   \
    ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName,  \
                         int nNodes, int nranks, int rank, ncclDebugLogger_t logfn);                   \
    ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_##V##_t* eDescr); \
    ncclResult_t (*stopEvent)(void* eHandle);                                                           \
    ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_t eState,                   \
                                     ncclProfilerEventStateArgs_##V##_t* eStateArgs);                  \
    ncclResult_t (*finalize)(void* context);                                                            \
  } ncclProfiler_##V##_t;
NCCL_ABI_PROFILER_STRUCT(v5)
NCCL_ABI_PROFILER_STRUCT(v6)
NCCL_ABI_PROFILER_STRUCT(v7)
#undef NCCL_ABI_PROFILER_STRUCT

/* ---------------------------------------------------------------- env plugin */

/* v1 (NCCL 2.28.7+). getEnv's result must stay valid until NCCL calls getEnv again on the same
 * name or finalize (env_v1.h). */
typedef struct {
  const char* name;
  ncclResult_t (*init)(uint8_t ncclMajor, uint8_t ncclMinor, uint8_t ncclPatch, const char* suffix);
  ncclResult_t (*finalize)(void);
  const char* (*getEnv)(const char* name);
} ncclEnv_v1_t;

/* v2 (NCCL 2.30.7+): init also receives NCCL's logger. NCCL looks up v2 first, then v1
 * (src/plugin/env.cc). */
typedef struct {
  const char* name;
  ncclResult_t (*init)(uint8_t ncclMajor, uint8_t ncclMinor, uint8_t ncclPatch, const char* suffix,
                       ncclDebugLogger_t logFunction);
  ncclResult_t (*finalize)(void);
  const char* (*getEnv)(const char* name);
} ncclEnv_v2_t;

/* ---------------------------------------------------------------- layout checks (x86-64 / aarch64) */

#if defined(__LP64__) && !defined(__cplusplus)
_Static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId is 128 bytes");
_Static_assert(offsetof(ncclConfig_t, magic) == 8 && offsetof(ncclConfig_t, version) == 12, "config header");
_Static_assert(offsetof(ncclConfig_t, netName) == 32 && offsetof(ncclConfig_t, splitShare) == 40, "config 2.17");
_Static_assert(offsetof(ncclConfig_t, commName) == 48 && offsetof(ncclConfig_t, nvlsCTAs) == 68, "config 2.27");
_Static_assert(offsetof(ncclConfig_t, nChannelsPerNetPeer) == 72, "config 2.28");
_Static_assert(offsetof(ncclConfig_t, graphUsageMode) == 80, "config 2.29");
_Static_assert(offsetof(ncclConfig_t, maxP2pPeers) == 88 && offsetof(ncclConfig_t, graphStreamOrdering) == 92,
               "config 2.30");
_Static_assert(offsetof(ncclConfig_t, launchOrderImplicit) == 96 && offsetof(ncclConfig_t, hostCftMode) == 108,
               "config 2.31");
_Static_assert(offsetof(ncclConfig_t, nvlsHostMode) == 112 && sizeof(ncclConfig_t) == 120, "config 2.32");
_Static_assert(offsetof(ncclProfilerEventDescr_v4_t, coll) == 24, "v4 union");
_Static_assert(offsetof(ncclProfilerEventDescr_v4_t, coll.datatype) == 72, "v4 coll.datatype");
_Static_assert(offsetof(ncclProfilerEventDescr_v4_t, coll.nChannels) == 80, "v4 coll.nChannels");
_Static_assert(offsetof(ncclProfilerEventDescr_v4_t, coll.proto) == 96, "v4 coll.proto");
_Static_assert(offsetof(ncclProfilerEventDescr_v5_t, coll.proto) == 96, "v5 coll.proto");
_Static_assert(offsetof(ncclProfilerEventDescr_v6_t, coll.proto) == 96, "v6 coll.proto");
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, coll.proto) == 96, "v7 coll.proto");
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, coll.userTag) == 128, "v7 coll.userTag");
_Static_assert(sizeof(ncclProfiler_v4_t) == 48 && sizeof(ncclProfiler_v7_t) == 48, "profiler tables");
_Static_assert(sizeof(ncclEnv_v1_t) == 32 && sizeof(ncclEnv_v2_t) == 32, "env tables");
#endif

#ifdef __cplusplus
}
#endif
#endif /* NCCLPROBE_NCCL_ABI_H */
