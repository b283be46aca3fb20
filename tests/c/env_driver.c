/* env_driver.c - drives the env plugin as NCCL does (dlopen RTLD_LOCAL, ncclEnvPlugin_v2, init,
 * getEnv from NCCL's code for every variable read) in situations a host can create.
 * usage: env_driver <plugin.so> <mode> [args]
 *   count <n>       after one warm-up read of each name, n more reads of NCCL_ALGO, NCCL_PROTO and
 *                   HOME; prints how many fstat/getpid/dladdr/pthread_mutex_lock calls the plugin
 *                   made during them (built with -DCOUNT_CALLS -rdynamic, which interposes those)
 *   bench <n>       ns per getEnv("NCCL_ALGO") through the plugin and per plain getenv, same run
 *   errno           errno across init (which opens the log) and across the first getEnv
 *   fd2 <file>      closes fd 2, opens <file> (it becomes fd 2), then reads NCCL_PROTO
 *   plant <kind>    before the first event, puts <kind> at the log file's name: fifo | open0666 |
 *                   other (a 0600 file of uid 65534; root only)
 *   chdir <dir>     reads NCCL_PROTO, then a fork child chdir()s to <dir> and reads NCCL_ALGO
 * Every mode prints the values read as name=value (or name=(null)) and checks them against getenv. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl_abi.h"

#ifdef COUNT_CALLS
/* The probe calls these through its PLT; an executable linked with -rdynamic defines them first in
 * the global scope, so the probe's calls land here. */
static int counting;
static long n_fstat, n_getpid, n_dladdr, n_lock;

int fstat(int fd, struct stat* st) {
  static int (*real)(int, struct stat*);
  if (!real) real = (int (*)(int, struct stat*))dlsym(RTLD_NEXT, "fstat");
  if (__atomic_load_n(&counting, __ATOMIC_RELAXED)) __atomic_add_fetch(&n_fstat, 1, __ATOMIC_RELAXED);
  return real(fd, st);
}

pid_t getpid(void) {
  static pid_t (*real)(void);
  if (!real) real = (pid_t (*)(void))dlsym(RTLD_NEXT, "getpid");
  if (__atomic_load_n(&counting, __ATOMIC_RELAXED)) __atomic_add_fetch(&n_getpid, 1, __ATOMIC_RELAXED);
  return real();
}

int dladdr(const void* addr, Dl_info* info) {
  static int (*real)(const void*, Dl_info*);
  if (!real) real = (int (*)(const void*, Dl_info*))dlsym(RTLD_NEXT, "dladdr");
  if (__atomic_load_n(&counting, __ATOMIC_RELAXED)) __atomic_add_fetch(&n_dladdr, 1, __ATOMIC_RELAXED);
  return real(addr, info);
}

int pthread_mutex_lock(pthread_mutex_t* m) {
  static int (*real)(pthread_mutex_t*);
  if (!real) real = (int (*)(pthread_mutex_t*))dlsym(RTLD_NEXT, "pthread_mutex_lock");
  if (__atomic_load_n(&counting, __ATOMIC_RELAXED)) __atomic_add_fetch(&n_lock, 1, __ATOMIC_RELAXED);
  return real(m);
}
#endif

static ncclEnv_v2_t* plugin;

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {}

/* One call site for every read, as NCCL has (ncclGetEnv): the plugin caches by return address. */
__attribute__((noinline)) static const char* get(const char* name) {
  const char* v = plugin->getEnv(name);
  if (v != getenv(name)) {
    fprintf(stderr, "getEnv(%s) differs from getenv\n", name);
    exit(5);
  }
  return v;
}

static void show(const char* name) {
  const char* v = get(name);
  printf("%s=%s\n", name, v ? v : "(null)");
}

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

static void bench(long n) {
  volatile const char* sink;
  double best_plugin = 1e18, best_plain = 1e18;
  for (int round = 0; round < 5; round++) { /* interleaved; the best round of each */
    double t0 = now_ns();
    for (long i = 0; i < n; i++) sink = plugin->getEnv("NCCL_ALGO");
    double t1 = now_ns();
    for (long i = 0; i < n; i++) sink = getenv("NCCL_ALGO");
    double t2 = now_ns();
    if ((t1 - t0) / n < best_plugin) best_plugin = (t1 - t0) / n;
    if ((t2 - t1) / n < best_plain) best_plain = (t2 - t1) / n;
  }
  (void)sink;
  printf("plugin_ns=%.1f getenv_ns=%.1f\n", best_plugin, best_plain);
}

static void plant(const char* kind) {
  const char* dir = getenv("NCCLPROBE_DIR");
  char host[256] = "unknown", path[4096];
  if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "unknown");
  for (char* p = host; *p; p++)
    if (*p == '/') *p = '_';
  snprintf(path, sizeof path, "%s/%s-%d.jsonl", dir, host, (int)getpid());
  if (!strcmp(kind, "fifo")) {
    if (mkfifo(path, 0600) != 0) exit(6);
  } else {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) exit(6);
    if (!strcmp(kind, "open0666")) fchmod(fd, 0666);
    else if (fchown(fd, 65534, 65534) != 0) exit(6);
    close(fd);
  }
  printf("planted %s\n", path);
}

static void in_child_dir(const char* dir) {
  show("NCCL_PROTO");
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    if (chdir(dir) != 0) _exit(6);
    show("NCCL_ALGO");
    fflush(stdout);
    _exit(0);
  }
  int st;
  waitpid(pid, &st, 0);
  printf("child status=%d\n", st);
}

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const char* mode = argv[2];
  /* What the host does before NCCL loads the plugin (whose init already logs plugin_load). */
  if (!strcmp(mode, "plant") && argc > 3) {
    plant(argv[3]);
  } else if (!strcmp(mode, "fd2") && argc > 3) {
    close(2);
    int fd = open(argv[3], O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd != 2) return 6;
  }
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 3;
  }
  plugin = (ncclEnv_v2_t*)dlsym(h, "ncclEnvPlugin_v2");
  if (!plugin) return 3;
  errno = 0;
  if (plugin->init(2, 30, 7, "", logger) != ncclSuccess) return 3;
  int init_errno = errno;
  if (!strcmp(mode, "count")) {
#ifdef COUNT_CALLS
    static const char* const names[] = {"NCCL_ALGO", "NCCL_PROTO", "HOME"};
    for (int k = 0; k < 3; k++) show(names[k]);
    long n = argc > 3 ? atol(argv[3]) : 1000;
    __atomic_store_n(&counting, 1, __ATOMIC_RELAXED);
    for (long i = 0; i < n; i++)
      for (int k = 0; k < 3; k++) get(names[k]);
    __atomic_store_n(&counting, 0, __ATOMIC_RELAXED);
    printf("fstat=%ld getpid=%ld dladdr=%ld lock=%ld\n", n_fstat, n_getpid, n_dladdr, n_lock);
#else
    return 2;
#endif
  } else if (!strcmp(mode, "bench")) {
    bench(argc > 3 ? atol(argv[3]) : 1000000);
  } else if (!strcmp(mode, "errno")) {
    errno = 0;
    const char* v = get("NCCL_PROTO");
    int e = errno;
    printf("init errno=%d NCCL_PROTO=%s errno=%d\n", init_errno, v ? v : "(null)", e);
  } else if (!strcmp(mode, "fd2") || !strcmp(mode, "plant")) {
    show("NCCL_PROTO");
  } else if (!strcmp(mode, "chdir") && argc > 3) {
    in_child_dir(argv[3]);
  } else {
    return 2;
  }
  return plugin->finalize() == ncclSuccess ? 0 : 4;
}
