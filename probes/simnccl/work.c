/* work.c - the two threads NCCL's profiler events come from besides the caller's: the CUDA
 * host-callback thread (a graph replay's hostStreamPlanCallback: Group/Coll) and the proxy
 * progress thread (KernelCh, src/transport/profiler.cc). One of each per process, started with the
 * first work posted to it, fed through a bounded queue (a full queue holds the poster back, as a
 * full stream would), drained before a communicator's plugin context is finalized, and stopped
 * and joined when the last communicator goes. A forked child starts with no threads and no queued
 * work (the parent's threads deliver the parent's events).
 */
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "sim.h"

#define QUEUE_CAP 1024

typedef struct {
  simWork items[QUEUE_CAP];
  int head, count;
  int busy;      /* an item is being delivered, outside the lock */
  int running;   /* the thread exists (in this process) */
  int stopReq;
  pthread_t thread;
  pthread_cond_t notEmpty, notFull;
} simWorker;

static pthread_mutex_t workLock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t workIdle = PTHREAD_COND_INITIALIZER;    /* an item was delivered */
static pthread_cond_t workStopped = PTHREAD_COND_INITIALIZER; /* a stop finished */
static simWorker workers[SIM_NUM_WORKERS] = {
    {.notEmpty = PTHREAD_COND_INITIALIZER, .notFull = PTHREAD_COND_INITIALIZER},
    {.notEmpty = PTHREAD_COND_INITIALIZER, .notFull = PTHREAD_COND_INITIALIZER}};
static int stopping;
static pthread_once_t forkOnce = PTHREAD_ONCE_INIT;

static void deliver(int which, simWork* w) {
  if (which == SIM_WORK_CALLBACK) simProfilerReplay(&w->task, w->kstart, w->dur);
  else simProfilerKernelCh(w->task.comm, w->coll, w->task.mask, w->task.nChannels, w->kstart, w->dur);
}

static void* workerMain(void* arg) {
  int which = (int)(intptr_t)arg;
  simWorker* q = &workers[which];
  pthread_mutex_lock(&workLock);
  for (;;) {
    while (q->count == 0 && !q->stopReq) pthread_cond_wait(&q->notEmpty, &workLock);
    if (q->count == 0) break; /* asked to stop and drained */
    simWork w = q->items[q->head];
    q->head = (q->head + 1) % QUEUE_CAP;
    q->count--;
    q->busy = 1;
    pthread_cond_signal(&q->notFull);
    pthread_mutex_unlock(&workLock);
    deliver(which, &w);
    pthread_mutex_lock(&workLock);
    q->busy = 0;
    w.task.comm->pending--;
    pthread_cond_broadcast(&workIdle);
  }
  pthread_mutex_unlock(&workLock);
  return NULL;
}

/* the child of a fork: the threads are gone, their queues belong to the parent */
static void atforkPrepare(void) {
  simGraphAtfork(0);
  pthread_mutex_lock(&workLock);
}
static void atforkParent(void) {
  pthread_mutex_unlock(&workLock);
  simGraphAtfork(1);
}
static void atforkChild(void) {
  simGraphAtfork(2);
  pthread_mutex_init(&workLock, NULL);
  pthread_cond_init(&workIdle, NULL);
  pthread_cond_init(&workStopped, NULL);
  for (int i = 0; i < SIM_NUM_WORKERS; i++) {
    simWorker* q = &workers[i];
    for (int k = 0; k < q->count; k++) q->items[(q->head + k) % QUEUE_CAP].task.comm->pending--;
    q->head = q->count = q->busy = q->running = q->stopReq = 0;
    pthread_cond_init(&q->notEmpty, NULL);
    pthread_cond_init(&q->notFull, NULL);
  }
  stopping = 0;
}
static void registerFork(void) { pthread_atfork(atforkPrepare, atforkParent, atforkChild); }
void simWorkForkInit(void) { pthread_once(&forkOnce, registerFork); }

/* called with workLock held */
static int startLocked(int which) {
  static const char* names[SIM_NUM_WORKERS] = {"simnccl-cbk", "simnccl-proxy"};
  simWorker* q = &workers[which];
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* signals stay with the application's threads */
  int rc = pthread_create(&q->thread, NULL, workerMain, (void*)(intptr_t)which);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) return -1;
  pthread_setname_np(q->thread, names[which]);
  q->running = 1;
  return 0;
}

int simWorkPost(int which, const simWork* w) {
  simWorkForkInit();
  simWorker* q = &workers[which];
  pthread_mutex_lock(&workLock);
  /* posts from the callback thread to the proxy never wait for a stop: the proxy outlives it */
  int internal = which == SIM_WORK_PROXY && workers[SIM_WORK_CALLBACK].running &&
                 pthread_equal(pthread_self(), workers[SIM_WORK_CALLBACK].thread);
  while (stopping && !internal) pthread_cond_wait(&workStopped, &workLock);
  if ((w->commUid && !simCommIsLive(w->task.comm, w->commUid)) || (!q->running && startLocked(which) != 0)) {
    pthread_mutex_unlock(&workLock);
    return -1;
  }
  w->task.comm->pending++; /* before any wait: a drain of this comm waits for it */
  while (q->count == QUEUE_CAP) pthread_cond_wait(&q->notFull, &workLock);
  q->items[(q->head + q->count) % QUEUE_CAP] = *w;
  q->count++;
  pthread_cond_signal(&q->notEmpty);
  pthread_mutex_unlock(&workLock);
  return 0;
}

void simWorkDrainComm(struct ncclComm* comm) {
  pthread_mutex_lock(&workLock);
  while (comm->pending > 0) pthread_cond_wait(&workIdle, &workLock);
  pthread_mutex_unlock(&workLock);
}

void simWorkSync(void) {
  pthread_mutex_lock(&workLock);
  for (;;) {
    int idle = 1;
    for (int i = 0; i < SIM_NUM_WORKERS; i++) idle &= workers[i].count == 0 && !workers[i].busy;
    if (idle) break;
    pthread_cond_wait(&workIdle, &workLock);
  }
  pthread_mutex_unlock(&workLock);
}

/* The callback thread first (its last replays still post to the proxy), then the proxy. */
void simWorkStop(void) {
  pthread_mutex_lock(&workLock);
  if (stopping) { /* another thread is stopping them */
    while (stopping) pthread_cond_wait(&workStopped, &workLock);
    pthread_mutex_unlock(&workLock);
    return;
  }
  stopping = 1;
  for (int i = 0; i < SIM_NUM_WORKERS; i++) {
    simWorker* q = &workers[i];
    if (!q->running) continue;
    q->stopReq = 1;
    pthread_cond_signal(&q->notEmpty);
    pthread_t t = q->thread;
    pthread_mutex_unlock(&workLock);
    pthread_join(t, NULL);
    pthread_mutex_lock(&workLock);
    q->running = 0;
    q->stopReq = 0;
  }
  stopping = 0;
  pthread_cond_broadcast(&workStopped);
  pthread_mutex_unlock(&workLock);
}
