/* sim.h - ncclprobe's simulated NCCL (libnccl.so.2 without GPU or CUDA), internal declarations.
 *
 * It reproduces what ncclprobe observes of NCCL 2.28.9: the exported API subset that PyTorch-style
 * (linked) and SGLang/vLLM-style (ctypes) callers use, the environment semantics (NCCL_PARAM caching
 * per process, NCCL_PROTO/NCCL_ALGO re-read per communicator, nccl.conf applied with setenv(..., 0),
 * every lookup through the env plugin), the profiler and env plugin ABIs, and NCCL_DEBUG log lines in
 * NCCL's formats. It moves no data between processes: all-reduce copies send to recv.
 */
#ifndef NCCLSIM_SIM_H
#define NCCLSIM_SIM_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "../include/nccl_abi.h"

#define SIM_API __attribute__((visibility("default")))

#define SIM_MAJOR 2
#define SIM_MINOR 28
#define SIM_PATCH 9
#define SIM_SUFFIX "-simulated"
#define SIM_VERSION_CODE NCCL_ABI_VERSION(SIM_MAJOR, SIM_MINOR, SIM_PATCH)
#define SIM_VERSION_LINE "NCCL version 2.28.9-simulated+cpu"

/* debug subsystems (src/include/nccl_common.h) */
#define SIM_INIT 0x1ul
#define SIM_COLL 0x2ul
#define SIM_P2P 0x4ul
#define SIM_SHM 0x8ul
#define SIM_NET 0x10ul
#define SIM_GRAPH 0x20ul
#define SIM_TUNING 0x40ul
#define SIM_ENV 0x80ul
#define SIM_ALLOC 0x100ul
#define SIM_CALL 0x200ul
#define SIM_PROXY 0x400ul
#define SIM_NVLS 0x800ul
#define SIM_BOOTSTRAP 0x1000ul
#define SIM_REG 0x2000ul
#define SIM_PROFILE 0x4000ul
#define SIM_RAS 0x8000ul
#define SIM_ALL (~0ul)

/* debug.c */
void simLog(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
void simDebugInit(void);
int simDebugLevel(void);
const char* simLastError(void);
void simSetThreadDev(int dev);
#define INFO(flags, ...) simLog(NCCL_LOG_INFO, (flags), __FILE__, __LINE__, __VA_ARGS__)
#define WARN(...) simLog(NCCL_LOG_WARN, SIM_ALL, __FILE__, __LINE__, __VA_ARGS__)

/* env.c */
void simInitEnv(void);
const char* simGetEnv(const char* name);
typedef struct {
  const char* name; /* without the NCCL_ prefix */
  int64_t deflt;
  int64_t value;
  int loaded;
} simParam;
int64_t simParamGet(simParam* p);
extern simParam simParamMinNchannels, simParamMaxNchannels, simParamBuffSize, simParamLlBuffSize,
    simParamLl128BuffSize, simParamNthreads, simParamLl128Nthreads, simParamShmDisable, simParamIbDisable,
    simParamNvlsEnable, simParamCuMemEnable, simParamCrossNic, simParamGraphMixing, simParamMinCTAs,
    simParamMaxCTAs, simParamCGAClusterSize, simParamCommBlocking, simParamSplitShare, simParamCtaPolicy,
    simParamNvlsChannels;
int simP2pLevel(void);
int simGdrLevel(void);
void simReadProcessParams(void);

/* tune.c */
enum { SIM_ALGO_TREE, SIM_ALGO_RING, SIM_ALGO_COLLNET_DIRECT, SIM_ALGO_COLLNET_CHAIN, SIM_ALGO_NVLS,
       SIM_ALGO_NVLS_TREE, SIM_ALGO_PAT, SIM_NUM_ALGOS };
enum { SIM_PROTO_LL, SIM_PROTO_LL128, SIM_PROTO_SIMPLE, SIM_NUM_PROTOS };
enum { SIM_FUNC_BROADCAST, SIM_FUNC_REDUCE, SIM_FUNC_ALLGATHER, SIM_FUNC_REDUCESCATTER, SIM_FUNC_ALLREDUCE,
       SIM_NUM_FUNCS };
extern const char* simFuncStr[SIM_NUM_FUNCS];
extern const char* simAlgoStr[SIM_NUM_ALGOS];
extern const char* simProtoStr[SIM_NUM_PROTOS];
const char* simAlgoToString(int algo);
const char* simProtoToString(int proto);
/* -1 unset by the user (model decides), 0 disabled, 1 enabled */
typedef struct {
  int algo[SIM_NUM_FUNCS][SIM_NUM_ALGOS];
  int proto[SIM_NUM_FUNCS][SIM_NUM_PROTOS];
  char protoStr[256], algoStr[256]; /* as read at this comm's init */
} simTuning;
ncclResult_t simParseList(const char* str, int nelems, const char* const elems[], int* list);
ncclResult_t simTuneComm(simTuning* t);
ncclResult_t simPick(const simTuning* t, int func, size_t nbytes, int* algo, int* proto);

/* the communicator */
#define SIM_COMM_MAGIC 0x53494d434f4d4d31ull /* "SIMCOMM1" */
struct ncclComm {
  uint64_t magic;
  struct ncclComm* next;       /* live list */
  int rank, nranks, cudaDev;
  uint64_t commHash;
  struct ncclComm* parent;
  int childCount;
  int finalized;
  const char* api;
  ncclConfig_t config;
  char commName[128];
  simTuning tuning;
  int nChannels;
  uint64_t seqNumber; /* comm->seqNumber[ncclFuncAllReduce]: the next Coll's, from 0 */
  uint64_t uid;       /* never reused: a graph's op names its communicator by it */
  uint64_t gpuFreeAt; /* simulated GPU clock (ns): when this comm's stream runs dry */
  int pending;        /* queued host-callback and proxy work naming this comm (under the work lock) */
  void* profilerCtx;
  int profilerActive;
};

/* One all-reduce as a kernel plan carries it (NCCL's ncclTaskColl). */
typedef struct {
  struct ncclComm* comm;
  const void* sendbuff;
  void* recvbuff;
  size_t count, nbytes;
  ncclDataType_t dt;
  int algo, proto, nChannels, nWarps;
  void* stream;
  int mask;      /* the global mask when the task was appended (enq.cc collTaskAppend) */
  void* collApi; /* the CollApi handle; a captured task keeps it for every replay */
} simTask;

/* profiler.c */
void simProfilerCommInit(struct ncclComm* comm);
void simProfilerCommFinalize(struct ncclComm* comm);
/* API events, KernelLaunch and, for an eager task or a captured one without proxy ops, Group/Coll
 * (+ KernelCh to the proxy thread). Returns 1 when a captured task needs a host callback per replay. */
int simProfilerEnqueue(simTask* t, int captured);
/* a replay's host callback (runs on the callback thread): Group/Coll, KernelCh to the proxy */
void simProfilerReplay(const simTask* t, uint64_t kstart, uint64_t dur);
/* the proxy thread's KernelCh events for one task */
void simProfilerKernelCh(struct ncclComm* comm, void* coll, int mask, int nChannels, uint64_t kstart, uint64_t dur);
uint64_t simKernelNs(int algo, int proto, size_t nbytes, int nranks);
uint64_t simGpuSchedule(struct ncclComm* comm, uint64_t dur);
uint64_t simNowNs(void);

/* work.c: the simulated CUDA host-callback thread and proxy progress thread */
enum { SIM_WORK_CALLBACK, SIM_WORK_PROXY, SIM_NUM_WORKERS };
typedef struct {
  simTask task;   /* callback: the replayed task; proxy: comm and mask only */
  void* coll;     /* proxy: the Coll handle (KernelCh parentObj) */
  uint64_t kstart, dur;
  uint64_t commUid; /* nonzero: post only if that communicator is still live */
} simWork;
int simWorkPost(int worker, const simWork* w);
void simWorkDrainComm(struct ncclComm* comm);
void simWorkSync(void);
void simWorkStop(void);
void simWorkForkInit(void); /* pthread_atfork for work.c and graph.c, once */

/* graph.c: stream capture */
void* simCaptureGraph(void* stream); /* the graph `stream` is capturing into, or NULL */
ncclResult_t simGraphReserve(void* graph);
ncclResult_t simGraphRecord(void* graph, const simTask* t, int replayEvents);
void simGraphsFreeAll(void);
void simGraphAtfork(int phase); /* 0 prepare, 1 parent, 2 child */

/* api.c */
const char* simDatatypeToString(ncclDataType_t dt);
int simCommIsLive(const struct ncclComm* comm, uint64_t uid);

#endif
