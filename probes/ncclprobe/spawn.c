/* spawn.c - the native edge witness: a `spawn` line (events.py) where a probed process starts another
 * or replaces its image: execve, execv, execvp, execvpe, execl, execlp, execle, fexecve, execveat,
 * posix_spawn, posix_spawnp. It records argv (redacted, below), the executable where it is known
 * without a search, the watched part of the environment actually passed and its size, the child's
 * pid for posix_spawn, and the errno of a call that failed. The real function (dlsym(RTLD_NEXT)) is
 * called with the caller's own arguments; its result and errno are given back unchanged.
 *
 * Two ways to the log:
 *  - a process whose writer thread runs (writer.c) queues the line and waits the usual bounded time
 *    (NP_SYNC_NS) for it to be written, before the exec replaces the image;
 *  - any other (a fork or vfork child about to exec: no writer thread, maybe a multithreaded parent's
 *    child where only async-signal-safe code may run) builds the line on its stack with no malloc,
 *    no stdio, no lock, touches no global (a vfork child shares them with its parent), and writes it
 *    itself: its own file <host>-<pid>.jsonl, opened O_NONBLOCK|O_NOFOLLOW|O_EXCL-or-private in the
 *    log directory the parent checked and kept (re-validated by fstat), one write(), closed. The
 *    exec'd image, probed again, appends to the same file (same pid). What this path cannot bound: a
 *    stalled filesystem holds the child (never the parent) in open/write.
 * An exec that fails writes a second line with `rc` (its errno): the first said what was tried.
 * argv: written as it is where no hint of a secret is in it (the boot probe's _ARGV_HINTS, the same
 * cheap test its _scrub makes); where there is one, every element from the first that holds a hint
 * on is "<redacted>" (the boot probe's full rules are Python; this errs on the side of hiding). */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "probe.h"

extern char** environ;

#define NP_ARGV_SCAN 16384 /* the boot probe's ARGV_SCAN: characters of argv read */
#define NP_SPAWN_LINE 8192

/* This process is a Python interpreter (the program or a loaded libpython defines Py_IsInitialized): its
 * edges are the boot probe's, with file:line (its records name the Python call; a second, native record of
 * the same exec would stand for it without them). Such a process writes no native spawn line. */
static int g_python;
static __thread int tl_in_spawn; /* a real exec/spawn that reaches another hooked one: recorded once */

/* ---------------------------------------------------------------- async-signal-safe pieces */

static void put_ll(np_jb* jb, long long v) {
  char t[24];
  int i = sizeof t;
  unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
  do t[--i] = (char)('0' + u % 10); while ((u /= 10) && i > 1);
  if (v < 0) t[--i] = '-';
  np_jb_raw(jb, t + i, sizeof t - (size_t)i);
}

static void jb_ll(np_jb* jb, const char* key, long long v) {
  size_t mark = jb->len;
  np_jb_key(jb, key);
  put_ll(jb, v);
  np_jb_settle(jb, mark);
}

static char upper(char c) { return c >= 'a' && c <= 'z' ? (char)(c - 32) : c; }

/* The boot probe's _ARGV_HINTS (probes/ncclprobe_boot.py; tests/test_probe_spawn.py checks they agree),
 * looked for in "\0".join(argv).upper(). */
static const char* const hints[] = {
    "@", "TOKEN", "SECRET", "PASSW", "PASSP", "PASS=", "PASS:", "PASS'", "PASS\"", "PASS ", "PASS\0", "PASS\t",
    "PASS\n", "KEY", "CREDENTIAL", "AUTH", "PRIVATE", "COOKIE", "_PAT", "-PAT", "_PWD", "-PWD", "-USER", "EYJ",
    "GHP_", "GHO_", "GHU_", "GHS_", "GHR_", "GLPAT", "HF_", "SK-", "XOX", "NPM_", "PYPI-", "LOGIN", "MYSQL",
    "MARIADB", "MONGO", "REDIS", "SQLCMD", "LDAP", "TWINE", "OPENSSL", "CURL", "PUT-PARAMETER", "BCP", "7Z",
    "ZIP\0", "ZIP ", "RAR\0", "RAR "};
static const unsigned char hint_len[] = {1, 5, 6, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 3, 10, 4, 7, 6, 4, 4, 4, 4, 5, 3,
                                         4, 4, 4, 4, 4, 5, 3, 3, 3, 4, 5, 5, 5, 7, 5, 5, 6, 4, 5, 7, 4, 13, 3, 2,
                                         4, 4, 4, 4};

/* Whether s (n bytes, followed in the joined text by `next`: '\0' between elements) holds a hint. */
static int has_hint(const char* s, size_t n, char next) {
  for (size_t i = 0; i < n; i++)
    for (size_t h = 0; h < sizeof hints / sizeof hints[0]; h++) {
      size_t l = hint_len[h], k = 0;
      while (k < l && (i + k < n ? upper(s[i + k]) : (i + k == n ? next : 1)) == hints[h][k]) k++;
      if (k == l) return 1;
    }
  return 0;
}

static void jb_argv(np_jb* jb, char* const* argv) {
  if (!argv) {
    np_jb_null(jb, "argv");
    return;
  }
  size_t mark = jb->len, scanned = 0;
  long long dropped = 0;
  int hidden = 0;
  np_jb_key(jb, "argv");
  np_jb_raw(jb, "[", 1);
  for (size_t i = 0; argv[i]; i++) {
    size_t n = strlen(argv[i]), before = jb->len;
    if (!hidden) hidden = has_hint(argv[i], n < NP_ARGV_SCAN ? n : NP_ARGV_SCAN, argv[i + 1] ? '\0' : 1);
    if (i) np_jb_raw(jb, ",", 1);
    np_jb_raw(jb, "\"", 1);
    if (hidden) {
      np_jb_raw(jb, "<redacted>", 10);
    } else if (scanned + n > NP_ARGV_SCAN) { /* past what the probe reads: not shown */
      np_jb_raw(jb, "<not scanned: ", 14);
      put_ll(jb, (long long)n);
      np_jb_raw(jb, " chars>", 7);
    } else {
      np_jb_escape(jb, argv[i], n < NP_VALUE_MAX ? n : NP_VALUE_MAX);
      if (n > NP_VALUE_MAX) jb->truncated = 1;
    }
    np_jb_raw(jb, "\"", 1);
    scanned += n + 1;
    if (jb->full || jb->len + 1024 > jb->cap - NP_JB_TAIL) { /* keep room for env and the rest */
      jb->len = before;
      jb->full = 0;
      for (size_t j = i; argv[j]; j++) dropped++;
      break;
    }
  }
  np_jb_raw(jb, "]", 1);
  np_jb_settle(jb, mark);
  if (dropped) jb_ll(jb, "argv_dropped", dropped);
}

/* Whether a variable starting with a, b may be watched (np_watched's names and prefixes start with these
 * pairs): most entries of a large environment are passed over without finding their '='. */
static int may_be_watched(char a, char b) {
  switch (a) {
    case 'N': return b == 'C';
    case 'T': return b == 'O';
    case 'C': return b == 'U';
    case 'L': return b == 'D';
    case 'P': return b == 'Y';
    case 'S': return b == 'G';
    case 'V': return b == 'L';
    default: return 0;
  }
}

/* ,"env":{watched of envp},"env_count":N: envp is the caller's array, read once each. */
static void jb_envp(np_jb* jb, char* const* envp) {
  size_t cap = jb->cap, mark = jb->len;
  long long count = 0;
  jb->cap = cap - 256; /* env_count, rc, exe */
  np_jb_key(jb, "env");
  np_jb_raw(jb, "{", 1);
  int first = 1;
  for (size_t i = 0; envp && envp[i]; i++) {
    const char* s = envp[i];
    count++;
    if (!may_be_watched(s[0], s[0] ? s[1] : 0)) continue;
    const char* eq = strchr(s, '=');
    if (!eq || !np_watched(s, (size_t)(eq - s)) || jb->full) continue;
    size_t before = jb->len, nlen = (size_t)(eq - s), vlen = strnlen(eq + 1, NP_VALUE_MAX + 1);
    if (nlen > NP_NAME_MAX || vlen > NP_VALUE_MAX) jb->truncated = 1;
    if (!first) np_jb_raw(jb, ",", 1);
    np_jb_raw(jb, "\"", 1);
    np_jb_escape(jb, s, nlen > NP_NAME_MAX ? NP_NAME_MAX : nlen);
    np_jb_raw(jb, "\":\"", 3);
    np_jb_escape(jb, eq + 1, vlen > NP_VALUE_MAX ? NP_VALUE_MAX : vlen);
    np_jb_raw(jb, "\"", 1);
    if (jb->full) { /* this one left out, the others still tried */
      jb->len = before;
      jb->full = 0;
      jb->truncated = 1;
      continue;
    }
    first = 0;
  }
  np_jb_raw(jb, "}", 1);
  np_jb_settle(jb, mark);
  jb->cap = cap;
  jb_ll(jb, "env_count", count);
}

/* ---------------------------------------------------------------- one record */

struct edge {
  const char* call;
  char* const* argv;
  char* const* envp;
  const char* exe;
  int exec;
  int env_given;
};

/* The members after the common ones. */
static void jb_edge(np_jb* jb, const struct edge* e, long long child, int rc) {
  np_jb_str(jb, "call", e->call);
  np_jb_null(jb, "where");
  jb_argv(jb, e->argv);
  np_jb_str(jb, "exe", e->exe);
  if (child > 0) jb_ll(jb, "child", child);
  else np_jb_null(jb, "child");
  np_jb_bool(jb, "exec", e->exec);
  np_jb_bool(jb, "env_given", e->env_given);
  jb_envp(jb, e->envp);
  if (rc) jb_ll(jb, "rc", rc);
}

/* {"ev":"spawn","t":..,"pid":..,"ppid":..,"src":"preload","host":..: without snprintf or a global written. */
static void child_begin(np_jb* jb) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  np_jb_raw(jb, "{\"ev\":\"spawn\",\"t\":", 18);
  put_ll(jb, (long long)ts.tv_sec);
  char frac[8] = {'.'};
  long us = ts.tv_nsec / 1000;
  for (int i = 6; i >= 1; i--, us /= 10) frac[i] = (char)('0' + us % 10);
  np_jb_raw(jb, frac, 7);
  /* In a pid namespace, the pid /proc shows (as writer.c's line_pid names a process) and the pid in there:
   * readlink only (async-signal-safe). A parent's pid in there cannot be told from outside: no ppid then. */
  long long pid = getpid(), shown = pid, pidns = 0;
  char ns[64];
  ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  if (n > 6 && (size_t)n < sizeof ns) {
    ns[n] = 0;
    if (strcmp(ns, NP_INIT_PIDNS) != 0 && strncmp(ns, "pid:[", 5) == 0 && ns[n - 1] == ']') {
      for (ssize_t i = 5; i < n - 1 && ns[i] >= '0' && ns[i] <= '9'; i++) pidns = pidns * 10 + (ns[i] - '0');
      char self[32];
      ssize_t k = readlink("/proc/self", self, sizeof self - 1);
      long long v = 0;
      for (ssize_t i = 0; i < k && self[i] >= '0' && self[i] <= '9'; i++) v = v * 10 + (self[i] - '0');
      if (v > 0) shown = v;
    }
  }
  jb_ll(jb, "pid", shown);
  if (pidns > 0) {
    jb_ll(jb, "ns_pid", pid);
    jb_ll(jb, "pidns", pidns);
  } else {
    jb_ll(jb, "ppid", getppid());
  }
  np_jb_str(jb, "src", "preload");
  char host[256];
  if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "unknown");
  host[sizeof host - 1] = 0;
  np_jb_str(jb, "host", host);
}

static void record(const struct edge* e, long long child, int rc) {
  if (g_python) return;
  int saved = errno;
  char buf[NP_SPAWN_LINE];
  np_jb jb;
  if (np_writer_running()) {
    if (np_log_enabled()) {
      np_jb_init(&jb, buf, sizeof buf);
      np_event_begin(&jb, "spawn", "preload");
      jb_edge(&jb, e, child, rc);
      np_event_end(&jb);
    }
  } else {
    np_jb_init(&jb, buf, sizeof buf);
    child_begin(&jb);
    jb_edge(&jb, e, child, rc);
    size_t n = jb.full ? 0 : np_event_finish(&jb);
    if (n) np_file_child_write(buf, n);
  }
  errno = saved;
}

/* posix_spawn* start a process without a fork of this one: always in a normal context. */
static void record_spawn(const struct edge* e, long long child, int rc) {
  if (g_python) return;
  int saved = errno;
  if (np_log_enabled()) {
    char buf[NP_SPAWN_LINE];
    np_jb jb;
    np_jb_init(&jb, buf, sizeof buf);
    np_event_begin(&jb, "spawn", "preload");
    jb_edge(&jb, e, child, rc);
    np_event_end(&jb);
  }
  errno = saved;
}

/* ---------------------------------------------------------------- the hooks */

/* The real functions, resolved at load: dlsym takes the loader's lock, which a fork child of a
 * multithreaded process may never get (a thread it does not have held it). */
enum { R_EXECVE, R_EXECV, R_EXECVP, R_EXECVPE, R_FEXECVE, R_EXECVEAT, R_SPAWN, R_SPAWNP, R_N };
static const char* const real_name[R_N] = {"execve", "execv", "execvp", "execvpe", "fexecve", "execveat",
                                           "posix_spawn", "posix_spawnp"};
static void* g_real[R_N];

__attribute__((constructor)) static void resolve_real(void) {
  int saved = errno;
  g_python = dlsym(RTLD_DEFAULT, "Py_IsInitialized") != NULL;
  for (int i = 0; i < R_N; i++) __atomic_store_n(&g_real[i], dlsym(RTLD_NEXT, real_name[i]), __ATOMIC_RELEASE);
  errno = saved;
}

#define REAL(type, name) ((type)__atomic_load_n(&g_real[name], __ATOMIC_ACQUIRE))

typedef int (*execve_fn)(const char*, char* const[], char* const[]);
typedef int (*execv_fn)(const char*, char* const[]);
typedef int (*fexecve_fn)(int, char* const[], char* const[]);
typedef int (*execveat_fn)(int, const char*, char* const[], char* const[], int);
typedef int (*spawn_fn)(pid_t*, const char*, const posix_spawn_file_actions_t*, const posix_spawnattr_t*,
                        char* const[], char* const[]);

/* path when it names the file without a search (it holds a '/'), else NULL. */
static const char* direct(const char* path) { return path && strchr(path, '/') ? path : NULL; }
static const char* absolute(const char* path) { return path && path[0] == '/' ? path : NULL; }

/* The exec, recorded before (it does not come back when it works) and again, with rc, when it failed.
 * The nesting mark is kept only by a process with its writer: a vfork child shares its parent's memory
 * (thread-locals included) and an exec that works never comes back to undo it. */
#define EXEC_CALL(real, e, call_expr)                \
  do {                                               \
    if (!(real)) {                                   \
      errno = ENOSYS;                                \
      return -1;                                     \
    }                                                \
    int outer_ = !tl_in_spawn;                       \
    int mark_ = outer_ && np_writer_running();       \
    if (outer_) record(&(e), 0, 0);                  \
    if (mark_) tl_in_spawn++;                        \
    int r_ = (call_expr);                            \
    if (mark_) tl_in_spawn--;                        \
    int err_ = errno;                                \
    if (outer_) record(&(e), 0, err_ ? err_ : -1);   \
    errno = err_;                                    \
    return r_;                                       \
  } while (0)

NP_EXPORT int execve(const char* path, char* const argv[], char* const envp[]) {
  execve_fn real = REAL(execve_fn, R_EXECVE);
  struct edge e = {"execve", argv, envp, path, 1, envp != environ};
  EXEC_CALL(real, e, real(path, argv, envp));
}

NP_EXPORT int execv(const char* path, char* const argv[]) {
  execv_fn real = REAL(execv_fn, R_EXECV);
  struct edge e = {"execv", argv, environ, path, 1, 0};
  EXEC_CALL(real, e, real(path, argv));
}

NP_EXPORT int execvp(const char* file, char* const argv[]) {
  execv_fn real = REAL(execv_fn, R_EXECVP);
  struct edge e = {"execvp", argv, environ, direct(file), 1, 0};
  EXEC_CALL(real, e, real(file, argv));
}

NP_EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) {
  execve_fn real = REAL(execve_fn, R_EXECVPE);
  struct edge e = {"execvpe", argv, envp, direct(file), 1, envp != environ};
  EXEC_CALL(real, e, real(file, argv, envp));
}

NP_EXPORT int fexecve(int fd, char* const argv[], char* const envp[]) {
  fexecve_fn real = REAL(fexecve_fn, R_FEXECVE);
  int err = errno; /* readlink below may set it */
  char link[32] = "/proc/self/fd/", exe[512];
  char* p = link + 14;
  char d[12];
  int k = 0;
  unsigned u = fd < 0 ? 0u : (unsigned)fd;
  do d[k++] = (char)('0' + u % 10); while ((u /= 10) && k < 11);
  while (k) *p++ = d[--k];
  *p = 0;
  ssize_t l = fd >= 0 ? readlink(link, exe, sizeof exe - 1) : -1;
  exe[l > 0 ? l : 0] = 0;
  errno = err;
  struct edge e = {"fexecve", argv, envp, l > 0 ? exe : NULL, 1, envp != environ};
  EXEC_CALL(real, e, real(fd, argv, envp));
}

NP_EXPORT int execveat(int dirfd, const char* path, char* const argv[], char* const envp[], int flags) {
  execveat_fn real = REAL(execveat_fn, R_EXECVEAT);
  struct edge e = {"execveat", argv, envp, absolute(path), 1, envp != environ};
  EXEC_CALL(real, e, real(dirfd, path, argv, envp, flags));
}

/* execl*: the arguments gathered on the stack (glibc's execl does the same) and handed to the real
 * execv/execvp/execve, which is what glibc's execl, execlp and execle call. */
#define GATHER(first, ap, argv, envp_out)                         \
  size_t n_ = 1;                                                  \
  va_start(ap, first);                                            \
  while (va_arg(ap, const char*)) n_++;                           \
  va_end(ap);                                                     \
  char* argv[n_ + 1];                                             \
  argv[0] = (char*)(first);                                       \
  va_start(ap, first);                                            \
  for (size_t i_ = 1; i_ <= n_; i_++) argv[i_] = va_arg(ap, char*); \
  envp_out;                                                       \
  va_end(ap);

NP_EXPORT int execl(const char* path, const char* arg, ...) {
  execv_fn real = REAL(execv_fn, R_EXECV);
  va_list ap;
  GATHER(arg, ap, argv, (void)0)
  struct edge e = {"execl", argv, environ, path, 1, 0};
  EXEC_CALL(real, e, real(path, argv));
}

NP_EXPORT int execlp(const char* file, const char* arg, ...) {
  execv_fn real = REAL(execv_fn, R_EXECVP);
  va_list ap;
  GATHER(arg, ap, argv, (void)0)
  struct edge e = {"execlp", argv, environ, direct(file), 1, 0};
  EXEC_CALL(real, e, real(file, argv));
}

NP_EXPORT int execle(const char* path, const char* arg, ...) {
  execve_fn real = REAL(execve_fn, R_EXECVE);
  va_list ap;
  char* const* envp;
  GATHER(arg, ap, argv, envp = va_arg(ap, char* const*))
  struct edge e = {"execle", argv, envp, path, 1, envp != environ};
  EXEC_CALL(real, e, real(path, argv, envp));
}

static int spawn_common(const char* call, spawn_fn real, pid_t* pid, const char* path,
                        const posix_spawn_file_actions_t* fa, const posix_spawnattr_t* attr, char* const argv[],
                        char* const envp[], const char* exe) {
  if (!real) return ENOSYS;
  pid_t child = 0;
  pid_t* where = pid ? pid : &child; /* the child's pid is known even where the caller does not ask */
  int outer = !tl_in_spawn;
  tl_in_spawn++;
  int rc = real(where, path, fa, attr, argv, envp);
  tl_in_spawn--;
  if (outer) {
    int err = errno;
    struct edge e = {call, argv, envp ? envp : environ, exe, 0, envp != NULL && envp != environ};
    record_spawn(&e, rc == 0 ? (long long)*where : 0, rc);
    errno = err;
  }
  return rc;
}

NP_EXPORT int posix_spawn(pid_t* pid, const char* path, const posix_spawn_file_actions_t* fa,
                          const posix_spawnattr_t* attr, char* const argv[], char* const envp[]) {
  spawn_fn real = REAL(spawn_fn, R_SPAWN);
  return spawn_common("posix_spawn", real, pid, path, fa, attr, argv, envp, path);
}

NP_EXPORT int posix_spawnp(pid_t* pid, const char* file, const posix_spawn_file_actions_t* fa,
                           const posix_spawnattr_t* attr, char* const argv[], char* const envp[]) {
  spawn_fn real = REAL(spawn_fn, R_SPAWNP);
  return spawn_common("posix_spawnp", real, pid, file, fa, attr, argv, envp, direct(file));
}
