/* nccl_app.c - a program dynamically linked against libnccl.so.2 (the fake one in the tests),
 * calling the communicator API the way a framework does. Prints one line per call:
 * "<api> rc=<rc>" so a test can compare the return codes with and without the preload hook.
 * Modes: basic | threads <n> | fork | all | bench <n> | errno */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl_abi.h"

ncclResult_t ncclGetUniqueId(ncclUniqueId*);
ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int);
ncclResult_t ncclCommInitRankConfig(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
ncclResult_t ncclCommInitAll(ncclComm_t*, int, const int*);
ncclResult_t ncclCommInitRankScalable(ncclComm_t*, int, int, int, ncclUniqueId*, ncclConfig_t*);
ncclResult_t ncclCommSplit(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*);
ncclResult_t ncclCommShrink(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int);
ncclResult_t ncclCommGrow(ncclComm_t, int, const ncclUniqueId*, int, ncclComm_t*, ncclConfig_t*);
ncclResult_t ncclCommDestroy(ncclComm_t);
ncclResult_t ncclCommAbort(ncclComm_t);
ncclResult_t ncclCommFinalize(ncclComm_t);
ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, void*);

#define SHOW(api, call)                        \
  do {                                         \
    ncclResult_t rc_ = (call);                 \
    printf("%s rc=%d\n", api, (int)rc_);       \
  } while (0)

static ncclConfig_t config_2_28(void) {
  /* What a caller compiled against NCCL 2.28's nccl.h passes: size 80, version 22809. */
  ncclConfig_t c;
  memset(&c, 0, sizeof c);
  for (int* p = &c.blocking; p <= &c.nvlsHostMode; p++) *p = NCCL_CONFIG_UNDEF_INT;
  c.netName = NULL;
  c.commName = NULL;
  c.size = offsetof(ncclConfig_t, graphUsageMode);
  c.magic = NCCL_API_MAGIC;
  c.version = NCCL_ABI_VERSION(2, 28, 9);
  c.blocking = 1;
  c.minCTAs = 4;
  /* APP_COMM_NAME / APP_NET_NAME: let a test pass strings of any size and content. */
  c.commName = getenv("APP_COMM_NAME") ? getenv("APP_COMM_NAME") : "tp0";
  c.netName = getenv("APP_NET_NAME") ? getenv("APP_NET_NAME") : "Socket";
  c.graphUsageMode = 1; /* beyond size 80: must not be reported */
  return c;
}

static void basic(void) {
  ncclUniqueId id;
  ncclComm_t a = NULL, b = NULL, s = NULL, bad = NULL;
  ncclGetUniqueId(&id);
  SHOW("ncclCommInitRank", ncclCommInitRank(&a, 2, id, 0));
  ncclConfig_t cfg = config_2_28();
  setenv("NCCL_PROTO", "LL", 1); /* changed in-process between two inits */
  SHOW("ncclCommInitRankConfig", ncclCommInitRankConfig(&b, 2, id, 1, &cfg));
  SHOW("ncclCommSplit", ncclCommSplit(a, 3, 7, &s, NULL));
  SHOW("ncclCommInitRank(bad)", ncclCommInitRank(&bad, 2, id, 5));
  ncclConfig_t broken = cfg;
  broken.magic = 0x1234;
  SHOW("ncclCommInitRankConfig(bad)", ncclCommInitRankConfig(&bad, 2, id, 0, &broken));
  float buf[256];
  for (int i = 0; i < 10; i++) ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, b, NULL);
  SHOW("ncclCommDestroy", ncclCommDestroy(s));
  SHOW("ncclCommDestroy", ncclCommDestroy(b));
  SHOW("ncclCommDestroy", ncclCommDestroy(a));
}

static void all(void) {
  ncclUniqueId ids[2];
  ncclGetUniqueId(&ids[0]);
  ncclGetUniqueId(&ids[1]);
  ncclComm_t comms[3] = {0}, sc = NULL, sh = NULL, gr = NULL, none = (ncclComm_t)1;
  int devs[3] = {4, 5, 6};
  SHOW("ncclCommInitAll", ncclCommInitAll(comms, 3, devs));
  ncclConfig_t cfg = config_2_28();
  SHOW("ncclCommInitRankScalable", ncclCommInitRankScalable(&sc, 4, 3, 2, ids, &cfg));
  int excl[1] = {1};
  SHOW("ncclCommShrink", ncclCommShrink(comms[0], excl, 1, &sh, NULL, 0));
  SHOW("ncclCommGrow", ncclCommGrow(comms[0], 5, &ids[0], 4, &gr, NULL));
  SHOW("ncclCommSplit(nocolor)", ncclCommSplit(comms[1], NCCL_SPLIT_NOCOLOR, 0, &none, NULL));
  SHOW("ncclCommFinalize", ncclCommFinalize(sc));
  SHOW("ncclCommAbort", ncclCommAbort(sc));
  SHOW("ncclCommDestroy(null)", ncclCommDestroy(NULL));
  for (int i = 0; i < 3; i++) ncclCommDestroy(comms[i]);
  ncclCommDestroy(sh);
  ncclCommDestroy(gr);
}

static void* thread_main(void* arg) {
  ncclUniqueId id;
  ncclComm_t c = NULL;
  memset(&id, (int)(intptr_t)arg, sizeof id);
  int bad = 0;
  for (int i = 0; i < 20; i++) {
    if (ncclCommInitRank(&c, 4, id, (int)((intptr_t)arg % 4)) != ncclSuccess) bad++;
    float buf[16];
    for (int k = 0; k < 5; k++) ncclAllReduce(buf, buf, 16, ncclFloat32, ncclSum, c, NULL);
    if (ncclCommDestroy(c) != ncclSuccess) bad++;
  }
  return (void*)(intptr_t)bad;
}

static void threads(int n) {
  pthread_t t[64];
  if (n > 64) n = 64;
  for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, thread_main, (void*)(intptr_t)(i + 1));
  int bad = 0;
  for (int i = 0; i < n; i++) {
    void* r;
    pthread_join(t[i], &r);
    bad += (int)(intptr_t)r;
  }
  printf("threads=%d failures=%d\n", n, bad);
}

static void forked(void) {
  ncclUniqueId id;
  ncclComm_t c = NULL;
  ncclGetUniqueId(&id);
  SHOW("parent ncclCommInitRank", ncclCommInitRank(&c, 2, id, 0));
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    ncclComm_t cc = NULL;
    SHOW("child ncclCommInitRank", ncclCommInitRank(&cc, 2, id, 1));
    ncclCommDestroy(cc);
    fflush(stdout);
    _exit(0);
  }
  int st;
  waitpid(pid, &st, 0);
  printf("child pid=%d status=%d\n", (int)pid, st);
  SHOW("parent ncclCommDestroy", ncclCommDestroy(c));
}

/* Mean ns per ncclCommInitRank+ncclCommDestroy pair. */
static void bench(int n) {
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < n; i++) {
    ncclComm_t c = NULL;
    ncclCommInitRank(&c, 2, id, 0);
    ncclCommDestroy(c);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
  printf("%.1f\n", ns / n);
}

/* errno as the host sees it right after each call: the hook's own work (the log's first open, its
 * writes) must not show through. */
static void show_errno(void) {
  ncclUniqueId id;
  ncclComm_t c = NULL;
  ncclGetUniqueId(&id);
  errno = 0;
  ncclResult_t rc = ncclCommInitRank(&c, 2, id, 0);
  printf("ncclCommInitRank rc=%d errno=%d\n", (int)rc, errno);
  errno = 0;
  rc = ncclCommDestroy(c);
  printf("ncclCommDestroy rc=%d errno=%d\n", (int)rc, errno);
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "basic";
  if (!strcmp(mode, "basic")) basic();
  else if (!strcmp(mode, "all")) all();
  else if (!strcmp(mode, "threads")) threads(argc > 2 ? atoi(argv[2]) : 16);
  else if (!strcmp(mode, "fork")) forked();
  else if (!strcmp(mode, "errno")) show_errno();
  else if (!strcmp(mode, "bench")) bench(argc > 2 ? atoi(argv[2]) : 10000);
  else return 2;
  return 0;
}
