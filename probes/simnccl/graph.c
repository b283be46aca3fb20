/* graph.c - simulated CUDA stream capture and graph launch, exported as ncclprobeSim* (not NCCL
 * API: the simulated NCCL has no CUDA, so the CUDA calls a framework would make come from here).
 *
 * While a stream captures, an all-reduce on it is recorded instead of run: the API events fire
 * once with graphCaptured (profiler.c); with KernelCh in the mask the plan gets a host callback
 * (enqueue.cc hostStreamPlanCallback) that each launch runs on the callback thread (Group/Coll,
 * then KernelCh from the proxy), keeping the CollApi handle seen at capture. A launch runs the
 * graph's data movement on the caller's thread. Bounded: 64 capturing streams, 256 live graphs of
 * up to 4096 operations; every graph left is freed with the last communicator.
 */
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define MAX_CAPTURES 64
#define MAX_GRAPHS 256
#define MAX_GRAPH_OPS 4096
#define GRAPH_MAGIC 0x53494d4752415048ull /* "SIMGRAPH" */

typedef struct {
  simTask task;
  uint64_t commUid;
  int replayEvents; /* a host callback per launch */
} simGraphOp;

typedef struct simGraph {
  uint64_t magic;
  struct simGraph* next;
  int nops, cap;
  simGraphOp* ops;
} simGraph;

static pthread_mutex_t graphLock = PTHREAD_MUTEX_INITIALIZER;
static struct { void* stream; simGraph* graph; } captures[MAX_CAPTURES];
static int nCapturing; /* read without the lock on every all-reduce */
static simGraph* liveGraphs;
static int nGraphs;

/* called with graphLock held */
static simGraph* findGraph(void* g) {
  for (simGraph* p = liveGraphs; p; p = p->next)
    if (p == g) return p;
  return NULL;
}

void* simCaptureGraph(void* stream) {
  if (!stream || __atomic_load_n(&nCapturing, __ATOMIC_ACQUIRE) == 0) return NULL;
  void* g = NULL;
  pthread_mutex_lock(&graphLock);
  for (int i = 0; i < MAX_CAPTURES && !g; i++)
    if (captures[i].stream == stream) g = captures[i].graph;
  pthread_mutex_unlock(&graphLock);
  return g;
}

/* called with graphLock held */
static ncclResult_t reserveLocked(simGraph* g) {
  if (!g) return ncclInvalidUsage;
  if (g->nops < g->cap) return ncclSuccess;
  int cap = g->cap ? g->cap * 2 : 16;
  simGraphOp* ops = cap <= MAX_GRAPH_OPS ? realloc(g->ops, (size_t)cap * sizeof(*ops)) : NULL;
  if (!ops) {
    WARN("Simulated graph capture: more than %d operations in one graph", MAX_GRAPH_OPS);
    return ncclSystemError;
  }
  g->ops = ops;
  g->cap = cap;
  return ncclSuccess;
}

ncclResult_t simGraphReserve(void* graph) {
  pthread_mutex_lock(&graphLock);
  ncclResult_t r = reserveLocked(findGraph(graph));
  pthread_mutex_unlock(&graphLock);
  return r;
}

ncclResult_t simGraphRecord(void* graph, const simTask* t, int replayEvents) {
  pthread_mutex_lock(&graphLock);
  simGraph* g = findGraph(graph);
  ncclResult_t r = reserveLocked(g);
  if (r == ncclSuccess) g->ops[g->nops++] = (simGraphOp){*t, t->comm->uid, replayEvents};
  pthread_mutex_unlock(&graphLock);
  return r;
}

SIM_API ncclResult_t ncclprobeSimStreamBeginCapture(void* stream) {
  if (!stream) {
    WARN("ncclprobeSimStreamBeginCapture : the default stream cannot be captured");
    return ncclInvalidArgument;
  }
  simWorkForkInit();
  ncclResult_t r = ncclSuccess;
  pthread_mutex_lock(&graphLock);
  int slot = -1;
  for (int i = 0; i < MAX_CAPTURES; i++) {
    if (captures[i].stream == stream) r = ncclInvalidUsage;
    if (!captures[i].stream && slot < 0) slot = i;
  }
  simGraph* g = NULL;
  if (r == ncclSuccess && (slot < 0 || nGraphs >= MAX_GRAPHS || !(g = calloc(1, sizeof(*g))))) r = ncclSystemError;
  if (r == ncclSuccess) {
    g->magic = GRAPH_MAGIC;
    g->next = liveGraphs;
    liveGraphs = g;
    nGraphs++;
    captures[slot].stream = stream;
    captures[slot].graph = g;
    __atomic_add_fetch(&nCapturing, 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&graphLock);
  if (r != ncclSuccess) WARN("ncclprobeSimStreamBeginCapture : stream %p: %s", stream,
                             r == ncclInvalidUsage ? "already capturing" : "too many captures or graphs");
  return r;
}

SIM_API ncclResult_t ncclprobeSimStreamEndCapture(void* stream, void** graph) {
  if (!graph) return ncclInvalidArgument;
  *graph = NULL;
  pthread_mutex_lock(&graphLock);
  for (int i = 0; stream && i < MAX_CAPTURES; i++)
    if (captures[i].stream == stream) {
      *graph = captures[i].graph;
      captures[i].stream = NULL;
      captures[i].graph = NULL;
      __atomic_sub_fetch(&nCapturing, 1, __ATOMIC_RELEASE);
      break;
    }
  pthread_mutex_unlock(&graphLock);
  if (!*graph) {
    WARN("ncclprobeSimStreamEndCapture : stream %p is not capturing", stream);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

/* Each operation in capture order: its data on this thread, and its host callback (if it has one)
 * queued to the callback thread with the kernel's place on the simulated GPU clock. Operations of
 * communicators destroyed since the capture are skipped. */
SIM_API ncclResult_t ncclprobeSimGraphLaunch(void* graph) {
  pthread_mutex_lock(&graphLock);
  simGraph* g = findGraph(graph);
  if (!g) {
    pthread_mutex_unlock(&graphLock);
    WARN("ncclprobeSimGraphLaunch : invalid graph %p", graph);
    return ncclInvalidArgument;
  }
  for (int i = 0; i < g->nops; i++) {
    simGraphOp* op = &g->ops[i];
    simTask* t = &op->task;
    if (!simCommIsLive(t->comm, op->commUid)) continue;
    if (t->nbytes && t->sendbuff != t->recvbuff) memmove(t->recvbuff, t->sendbuff, t->nbytes);
    if (!op->replayEvents) continue;
    simWork w;
    memset(&w, 0, sizeof(w));
    w.task = *t;
    w.dur = simKernelNs(t->algo, t->proto, t->nbytes, t->comm->nranks);
    w.kstart = simGpuSchedule(t->comm, w.dur);
    w.commUid = op->commUid; /* re-checked under the work lock: a destroy may race this launch */
    simWorkPost(SIM_WORK_CALLBACK, &w);
  }
  pthread_mutex_unlock(&graphLock);
  return ncclSuccess;
}

/* called with graphLock held */
static void freeGraphLocked(simGraph* g) {
  for (int i = 0; i < MAX_CAPTURES; i++)
    if (captures[i].graph == g) {
      captures[i].stream = NULL;
      captures[i].graph = NULL;
      __atomic_sub_fetch(&nCapturing, 1, __ATOMIC_RELEASE);
    }
  simGraph** pp = &liveGraphs;
  while (*pp && *pp != g) pp = &(*pp)->next;
  if (*pp) *pp = g->next;
  nGraphs--;
  g->magic = 0;
  free(g->ops);
  free(g);
}

/* Queued replays hold copies of their tasks, not the graph: it can go at once. */
SIM_API ncclResult_t ncclprobeSimGraphDestroy(void* graph) {
  pthread_mutex_lock(&graphLock);
  simGraph* g = findGraph(graph);
  if (g) freeGraphLocked(g);
  pthread_mutex_unlock(&graphLock);
  if (!g) {
    WARN("ncclprobeSimGraphDestroy : invalid graph %p", graph);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* cudaDeviceSynchronize for the profiler's view: every queued host callback and KernelCh event
 * has been delivered when it returns. */
SIM_API ncclResult_t ncclprobeSimSynchronize(void) {
  simWorkSync();
  return ncclSuccess;
}

/* fork handlers, called by work.c's in lock order (graphLock, then workLock) */
void simGraphAtfork(int phase) {
  if (phase == 0) pthread_mutex_lock(&graphLock);
  else if (phase == 1) pthread_mutex_unlock(&graphLock);
  else pthread_mutex_init(&graphLock, NULL); /* the child: captures and graphs stay as they were */
}

void simGraphsFreeAll(void) {
  pthread_mutex_lock(&graphLock);
  while (liveGraphs) freeGraphLocked(liveGraphs);
  pthread_mutex_unlock(&graphLock);
}
