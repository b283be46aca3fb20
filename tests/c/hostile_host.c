/* hostile_host.c - a program linked against libnccl.so.2 (the simulated NCCL of probes/simnccl) that
 * does to its own process what real hosts do and what the probe must survive (issue 21).
 * usage: hostile_host <mode> [args]
 *   forkfd <pipe|socket|file:PATH>  one communicator (the probe's log fd exists), then the host closes
 *                   every fd >= 3, puts its own pipe / socket / file on the log fd's old number with
 *                   dup2(), and forks: the child writes through that number. Prints
 *                   "logfd=N child_write=<rc> parent_got=<text>"
 *   stdio <report> <nofile>  closes fds 0-2 and lowers RLIMIT_NOFILE to <nofile> (so that nothing can
 *                   move above 200), creates a communicator, lists its fds into <report>, then writes
 *                   HOSTOUT to fd 1 as a host writes to its stdout
 *   stall <n>       phased through stdin/stdout for a test that freezes the log's filesystem:
 *                   "ready" after one communicator; on "go": n communicator inits (each after a
 *                   setenv of NCCL_PROTO, whose new values NCCL reads through the env plugin), 4096
 *                   all-reduces on a thread (the collective path flushes with NCCLPROBE_FLUSH_S=0),
 *                   a fork whose child creates a communicator and exit()s, then prints the slowest
 *                   of each ("phase1 init_ms=.. setenv_ms=.. coll_ms=.. fork_ms=.. child_ms=.."); on
 *                   "more": one communicator, "done", reaps the child, exits; on "exit" instead:
 *                   prints "exiting" and exit()s at once
 *   envrace <n> <vars>  a thread sets and unsets <vars> watched variables in a loop while the main
 *                   thread creates and destroys n communicators; prints "inits=n"
 *   lines <n1> <n2>  n1 communicators, "first", waits for a line on stdin, n2 more, "second"
 *   forks <k>       k fork children one after the other, each creating one communicator then exit();
 *                   the parent creates none; prints "child <pid>" for each, in order
 *   initall <n>     ncclCommInitAll over n devices (a device list longer than a line keeps)
 *   fsize <n>       one communicator, then RLIMIT_FSIZE at the log's size (its writes fail: EFBIG and
 *                   SIGXFSZ, whose default action kills the process), n communicators, the limit
 *                   lifted, one more; prints "alive" */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl_abi.h"

ncclResult_t ncclGetUniqueId(ncclUniqueId*);
ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int);
ncclResult_t ncclCommInitAll(ncclComm_t*, int, const int*);
ncclResult_t ncclCommDestroy(ncclComm_t);
ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, void*);

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void one_comm(void) {
  ncclUniqueId id;
  ncclComm_t c = NULL;
  ncclGetUniqueId(&id);
  if (ncclCommInitRank(&c, 2, id, 0) != ncclSuccess) {
    fprintf(stderr, "init failed\n");
    exit(3);
  }
  ncclCommDestroy(c);
}

/* The descriptor whose /proc/self/fd link ends in ".jsonl" (the probe's log), or -1. */
static int log_fd(void) {
  for (int fd = 0; fd < 1024; fd++) {
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 6) continue;
    target[n] = 0;
    if (!strcmp(target + n - 6, ".jsonl")) return fd;
  }
  return -1;
}

static int forkfd(const char* kind) {
  one_comm();
  int old = log_fd();
  if (old < 0) return 4;
  for (int fd = 3; fd < 1024; fd++) close(fd); /* a daemon's close-all */
  int mine, peer = -1, sv[2], p[2];
  if (!strcmp(kind, "pipe")) {
    if (pipe(p) != 0) return 5;
    mine = p[1], peer = p[0];
  } else if (!strcmp(kind, "socket")) {
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 5;
    mine = sv[0], peer = sv[1];
  } else if (!strncmp(kind, "file:", 5)) {
    mine = open(kind + 5, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  } else {
    return 2;
  }
  if (mine < 0 || dup2(mine, old) != old) return 6;
  if (mine != old) close(mine);
  pid_t pid = fork();
  if (pid == 0) { /* the host's descriptor must still be there in the child */
    ssize_t w = write(old, "child-ok\n", 9);
    _exit(w == 9 ? 0 : 10 + errno);
  }
  int st;
  waitpid(pid, &st, 0);
  char got[64] = "";
  if (peer >= 0) {
    close(old); /* the read end sees EOF once every writer is gone */
    ssize_t n = read(peer, got, sizeof got - 1);
    got[n > 0 ? n : 0] = 0;
    if (n > 0 && got[n - 1] == '\n') got[n - 1] = 0;
  }
  printf("logfd=%d child_write=%d parent_got=%s\n", old, WIFEXITED(st) ? WEXITSTATUS(st) : -1, got);
  return 0;
}

static int stdio(const char* report, int nofile) {
  FILE* out = fopen(report, "w"); /* opened while stdio is open: on fd 3 */
  if (!out) return 4;
  close(0), close(1), close(2);
  struct rlimit rl = {(rlim_t)nofile, (rlim_t)nofile};
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return 5;
  one_comm();
  for (int fd = 0; fd < 1024; fd++) {
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n > 0) fprintf(out, "fd %d %.*s\n", fd, (int)n, target);
  }
  ssize_t w = write(1, "HOSTOUT\n", 8); /* the host's "stdout" */
  fprintf(out, "hostout_rc %zd\n", w);
  fclose(out);
  return 0;
}

static ncclComm_t g_coll_comm;
static double g_coll_ms;

static void* collectives(void* arg) {
  float buf[64] = {0};
  for (int i = 0; i < 4096; i++) {
    double t0 = now_ms();
    ncclAllReduce(buf, buf, 64, ncclFloat32, ncclSum, g_coll_comm, NULL);
    double dt = now_ms() - t0;
    if (dt > g_coll_ms) g_coll_ms = dt;
  }
  return NULL;
}

static char* line_in(char* buf, size_t n) { return fgets(buf, (int)n, stdin); }

static int stall(int n) {
  static const char* const protos[] = {"Simple", "LL", "LL128"};
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  if (ncclCommInitRank(&g_coll_comm, 2, id, 0) != ncclSuccess) return 3;
  printf("ready\n");
  fflush(stdout);
  char cmd[64];
  if (!line_in(cmd, sizeof cmd)) return 4;
  double init_ms = 0, setenv_ms = 0, fork_ms = 0;
  pthread_t t;
  pthread_create(&t, NULL, collectives, NULL);
  for (int i = 0; i < n; i++) {
    double t0 = now_ms();
    setenv("NCCL_PROTO", protos[i % 3], 1);
    double t1 = now_ms();
    one_comm();
    double t2 = now_ms();
    if (t1 - t0 > setenv_ms) setenv_ms = t1 - t0;
    if (t2 - t1 > init_ms) init_ms = t2 - t1;
  }
  pthread_join(t, NULL);
  int p[2];
  if (pipe(p) != 0) return 5;
  double t0 = now_ms();
  pid_t pid = fork();
  if (pid == 0) {
    double c0 = now_ms();
    one_comm();
    double c1 = now_ms();
    dprintf(p[1], "%.1f\n", c1 - c0);
    exit(0); /* its exit, too, must not wait for the frozen filesystem */
  }
  fork_ms = now_ms() - t0;
  close(p[1]);
  char child[32] = "";
  ssize_t r = read(p[0], child, sizeof child - 1); /* the child's time, not its reaping */
  child[r > 0 ? r - 1 : 0] = 0;
  printf("phase1 init_ms=%.1f setenv_ms=%.1f coll_ms=%.1f fork_ms=%.1f child_ms=%s\n", init_ms, setenv_ms, g_coll_ms,
         fork_ms, child);
  fflush(stdout);
  if (!line_in(cmd, sizeof cmd)) return 6;
  if (!strncmp(cmd, "exit", 4)) {
    printf("exiting\n");
    fflush(stdout);
    exit(0);
  }
  one_comm();
  printf("done\n");
  fflush(stdout);
  int st;
  waitpid(pid, &st, 0);
  return 0;
}

static int g_stop;
static int g_nvars;

static void* churn(void* arg) {
  char name[64];
  while (!__atomic_load_n(&g_stop, __ATOMIC_RELAXED)) {
    for (int i = 0; i < g_nvars; i++) {
      snprintf(name, sizeof name, "NCCL_RACE_%d", i);
      setenv(name, "racing-value", 1);
    }
    for (int i = 0; i < g_nvars; i++) {
      snprintf(name, sizeof name, "NCCL_RACE_%d", i);
      unsetenv(name);
    }
  }
  return NULL;
}

static int envrace(int n, int nvars) {
  g_nvars = nvars;
  pthread_t t;
  pthread_create(&t, NULL, churn, NULL);
  for (int i = 0; i < n; i++) one_comm();
  __atomic_store_n(&g_stop, 1, __ATOMIC_RELAXED);
  pthread_join(t, NULL);
  printf("inits=%d\n", n);
  return 0;
}

static int lines(int n1, int n2) {
  for (int i = 0; i < n1; i++) one_comm();
  printf("first\n");
  fflush(stdout);
  char cmd[64];
  if (!line_in(cmd, sizeof cmd)) return 4;
  for (int i = 0; i < n2; i++) one_comm();
  printf("second\n");
  return 0;
}

static int forks(int k) {
  for (int i = 0; i < k; i++) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      one_comm();
      exit(0);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) return 3;
    printf("child %d\n", (int)pid);
  }
  printf("forks=%d\n", k);
  return 0;
}

static int initall(int n) {
  ncclComm_t* comms = calloc((size_t)n, sizeof *comms);
  int* devs = calloc((size_t)n, sizeof *devs);
  for (int i = 0; i < n; i++) devs[i] = i;
  ncclResult_t rc = ncclCommInitAll(comms, n, devs);
  for (int i = 0; rc == ncclSuccess && i < n; i++) ncclCommDestroy(comms[i]);
  printf("initall rc=%d\n", (int)rc);
  return 0;
}

static int fsize(int n) {
  one_comm();
  int fd = log_fd();
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) return 4;
  struct rlimit rl, old;
  getrlimit(RLIMIT_FSIZE, &old);
  rl = old;
  rl.rlim_cur = (rlim_t)st.st_size; /* not one more byte */
  if (setrlimit(RLIMIT_FSIZE, &rl) != 0) return 5;
  for (int i = 0; i < n; i++) one_comm();
  setrlimit(RLIMIT_FSIZE, &old);
  one_comm();
  printf("alive\n");
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const char* mode = argv[1];
  if (!strcmp(mode, "forkfd") && argc == 3) return forkfd(argv[2]);
  if (!strcmp(mode, "stdio") && argc == 4) return stdio(argv[2], atoi(argv[3]));
  if (!strcmp(mode, "stall") && argc == 3) return stall(atoi(argv[2]));
  if (!strcmp(mode, "envrace") && argc == 4) return envrace(atoi(argv[2]), atoi(argv[3]));
  if (!strcmp(mode, "lines") && argc == 4) return lines(atoi(argv[2]), atoi(argv[3]));
  if (!strcmp(mode, "forks") && argc == 3) return forks(atoi(argv[2]));
  if (!strcmp(mode, "initall") && argc == 3) return initall(atoi(argv[2]));
  if (!strcmp(mode, "fsize") && argc == 3) return fsize(atoi(argv[2]));
  return 2;
}
