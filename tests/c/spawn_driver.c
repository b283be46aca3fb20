/* spawn_driver.c - starts itself ("print" mode: its environment, NUL-separated, on stdout) through each
 * exec and spawn variant the preload probe hooks (tests/test_probe_spawn.py), and prints what the call
 * gave back: "rc=R errno=E [child=PID]".
 *   spawn_driver VARIANT          one call of it (execve, execv, ..., posix_spawnp, fork_exec, vfork_exec)
 *   spawn_driver fail             execve and posix_spawn of a missing file
 *   spawn_driver threads T K      T threads, each K times fork + execve
 *   spawn_driver bench N VARS     N vfork + execve of /bin/true with VARS extra variables: microseconds each
 *   spawn_driver cost N VARS      N execve of a missing file in this process (the call's own cost, no fork):
 *                                 microseconds each */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char** environ;
static char self[4096];
static char* args[] = {self, "print", "--api-key", "hunter2", NULL};
static char* envp[] = {"NCCL_PROTO=LL", "HOME=/nowhere", "SECRET_TOKEN=zzz", "NCCL_ALGO=Ring", NULL, NULL};

static int print_env(void) {
  for (char** e = environ; *e; e++) fwrite(*e, 1, strlen(*e) + 1, stdout);
  return 0;
}

static void said(int rc, int err) { printf("rc=%d errno=%d\n", rc, err); fflush(stdout); }

static int one(const char* v) {
  int rc;
  errno = 0;
  if (!strcmp(v, "execve")) rc = execve(self, args, envp);
  else if (!strcmp(v, "execv")) rc = execv(self, args);
  else if (!strcmp(v, "execvp")) rc = execvp(self, args);
  else if (!strcmp(v, "execvpe")) rc = execvpe(self, args, envp);
  else if (!strcmp(v, "execl")) rc = execl(self, self, "print", "--api-key", "hunter2", (char*)NULL);
  else if (!strcmp(v, "execlp")) rc = execlp(self, self, "print", "--api-key", "hunter2", (char*)NULL);
  else if (!strcmp(v, "execle")) rc = execle(self, self, "print", "--api-key", "hunter2", (char*)NULL, envp);
  else if (!strcmp(v, "fexecve")) rc = fexecve(open(self, O_RDONLY | O_CLOEXEC), args, envp);
  else if (!strcmp(v, "execveat")) rc = execveat(AT_FDCWD, self, args, envp, 0);
  else if (!strcmp(v, "posix_spawn") || !strcmp(v, "posix_spawnp")) {
    pid_t pid = 0;
    rc = (v[11] ? posix_spawnp : posix_spawn)(&pid, self, NULL, NULL, args, envp);
    int err = errno, st;
    waitpid(pid, &st, 0); /* its output first */
    printf("rc=%d errno=%d child=%d\n", rc, err, (int)pid);
    return 0;
  } else if (!strcmp(v, "fork_exec") || !strcmp(v, "vfork_exec")) {
    pid_t pid = v[0] == 'v' ? vfork() : fork();
    if (pid == 0) {
      execve(self, args, envp);
      _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    printf("child=%d\n", (int)pid);
    return 0;
  } else return 2;
  said(rc, errno);
  return 1;
}

static int fail(void) {
  char* argv[] = {"/nonexistent/prog", NULL};
  errno = 0;
  int rc = execve("/nonexistent/prog", argv, envp);
  said(rc, errno);
  pid_t pid = 0;
  errno = 77;
  rc = posix_spawn(&pid, "/nonexistent/prog", NULL, NULL, argv, envp);
  printf("rc=%d errno=%d child=%d\n", rc, errno, (int)pid);
  return 0;
}

static int per_thread;
static void* worker(void* arg) {
  for (int i = 0; i < per_thread; i++) {
    pid_t pid = fork();
    if (pid == 0) {
      char* a[] = {self, "quiet", NULL};
      execve(self, a, envp);
      _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
  }
  return arg;
}

static int threads(int t, int k) {
  per_thread = k;
  pthread_t th[64];
  for (int i = 0; i < t; i++) pthread_create(&th[i], NULL, worker, NULL);
  for (int i = 0; i < t; i++) pthread_join(th[i], NULL);
  return 0;
}

static int bench(int n, int vars, int cost) {
  /* room for a 200k-variable environment: the kernel lets exec take a quarter of the stack limit (6 MiB at most) */
  struct rlimit rl = {64 << 20, 64 << 20};
  setrlimit(RLIMIT_STACK, &rl);
  char** env = calloc((size_t)vars + 8, sizeof *env);
  int k = 0;
  for (char** e = envp; *e; e++) env[k++] = *e;
  for (int i = 0; i < vars; i++) {
    env[k] = malloc(32);
    snprintf(env[k++], 32, "V%d=1", i);
  }
  char* a[] = {"/bin/true", NULL};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < n && cost; i++) execve("/nonexistent/prog", a, env);
  for (int i = 0; i < n && !cost; i++) {
    pid_t pid = vfork();
    if (pid == 0) {
      execve("/bin/true", a, env);
      _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("%.1f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / n);
  return 0;
}

int main(int argc, char** argv) {
  ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
  if (l <= 0) return 3;
  if (!strcmp(argv[1], "print")) return print_env();
  if (!strcmp(argv[1], "quiet")) return 0;
  /* the probe's own wiring passed on, as `ncclprobe run` would */
  envp[4] = getenv("NCCLPROBE_DIR") ? getenv("NCCLPROBE_DIR") - strlen("NCCLPROBE_DIR=") : NULL;
  if (!strcmp(argv[1], "fail")) return fail();
  if (!strcmp(argv[1], "threads")) return threads(atoi(argv[2]), atoi(argv[3]));
  if (!strcmp(argv[1], "bench") || !strcmp(argv[1], "cost")) return bench(atoi(argv[2]), atoi(argv[3]), argv[1][0] == 'c');
  return one(argv[1]);
}
