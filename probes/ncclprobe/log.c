/* log.c - the per-process JSONL file: <NCCLPROBE_DIR>/<host>-<pid>.jsonl.
 *
 * NCCLPROBE_DIR unset: every probe is silent. The file is opened on the first event (never in a
 * constructor), re-opened when the pid changes (a fork child writes its own file) or when the
 * descriptor no longer names our file (a host that closes every fd and reuses the number must
 * never receive our lines). Each line is one write() on an O_APPEND descriptor, so concurrent
 * writers never interleave (DESIGN.md §4). An unusable directory costs one stderr warning.
 *
 * The names are predictable, so only a private place is used: the directory must be a real
 * directory (not a symlink) of our effective uid that neither group nor others can write to
 * (NCCLPROBE_DIR=/tmp is refused: another user could plant a FIFO or a file of theirs at our
 * name) and, for root (who owns them), no system directory (/etc, /usr, ...); a missing one is
 * created, its last component only, in a parent fit for it. The file must be a regular file of
 * ours that nobody else can read or write. It is opened O_NONBLOCK (a FIFO without a reader fails
 * at once instead of blocking the host, and with one fails the regular-file check) and set
 * blocking only once checked. The directory stays open (above NP_FD_FLOOR) and files are opened
 * relative to it, so a relative NCCLPROBE_DIR keeps naming the same directory after the host
 * chdir()s (fork children open their own file there). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "probe.h"

enum { ST_UNKNOWN = 0, ST_OPEN = 1, ST_SILENT = 2 };

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* taken to open, never to write */
static int g_state = ST_UNKNOWN;
static int g_fd = -1;
static pid_t g_pid;
static dev_t g_dev;
static ino_t g_ino;
static char g_host[256];
static char g_hostq[600]; /* host, JSON-escaped */
static int g_dirfd = -1;   /* the checked log directory (O_PATH), kept for re-opens */
static dev_t g_ddev;
static ino_t g_dino;

/* Keep our descriptor away from the low numbers that hosts dup2() onto and close() in loops. */
#define NP_FD_FLOOR 200

/* All the probe's locks, in the order probe.h gives (fork safety). */
static void atfork_prepare(void) {
  pthread_mutex_lock(&np_reg_lock);
  pthread_mutex_lock(&np_cache_lock);
  pthread_mutex_lock(&np_libs_lock);
  pthread_mutex_lock(&np_seen_lock);
  pthread_mutex_lock(&g_lock);
}
static void unlock_all(void) {
  pthread_mutex_unlock(&g_lock);
  pthread_mutex_unlock(&np_seen_lock);
  pthread_mutex_unlock(&np_libs_lock);
  pthread_mutex_unlock(&np_cache_lock);
  pthread_mutex_unlock(&np_reg_lock);
}
static void atfork_child(void) {
  /* The child must not append to its parent's file; the pid check re-opens on its next event. */
  if (g_fd >= 0) close(g_fd);
  g_fd = -1;
  if (g_state == ST_OPEN) g_state = ST_UNKNOWN;
  unlock_all();
}
/* Registered at load (no I/O, no allocation beyond glibc's handler entry): the handlers must be in
 * place before any of the locks can be taken. The library is never unloaded (-z nodelete). */
__attribute__((constructor)) static void register_atfork(void) {
  pthread_atfork(atfork_prepare, unlock_all, atfork_child);
}

uint64_t np_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Whether fd 2 is a place for a warning: open for writing and a terminal, pipe, socket or other
 * character device, or a regular file opened for appending (2>>log, systemd's append:). A host
 * that closed stderr may have fd 2 on a data file of its own (O_TRUNC or O_RDWR): never write
 * there, even if that costs the warning of a program started with 2>file. */
static int stderr_usable(void) {
  int fl = fcntl(2, F_GETFL);
  struct stat st;
  if (fl < 0 || (fl & O_ACCMODE) == O_RDONLY || fstat(2, &st) != 0) return 0;
  if (S_ISREG(st.st_mode)) return (fl & O_APPEND) != 0;
  return S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode);
}

static void warn_once(const char* dir, const char* what, const char* why) {
  /* One line, then silence for the life of the process (and its fork children). */
  g_state = ST_SILENT;
  if (!stderr_usable()) return;
  char msg[1200];
  int n = snprintf(msg, sizeof msg, "ncclprobe: cannot %s log in %s: %s; the probe stays silent\n", what, dir, why);
  if (n > 0) {
    ssize_t w = write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
    (void)w;
  }
}

static int move_high(int fd) {
  int high = fcntl(fd, F_DUPFD_CLOEXEC, NP_FD_FLOOR);
  if (high < 0) return fd;
  close(fd);
  return high;
}

/* Whether a directory of root's at the canonical path `real` is a system one: in the system's own
 * trees (or / itself), not in the scratch places under them where users keep private directories
 * (the boot probe's rule too). Only root's directories are asked (a log directory is euid's): for
 * root, ownership says nothing. */
static int system_dir(const char* real) {
  static const char* const tops[] = {"bin", "boot", "dev", "etc", "proc", "sbin", "sys", "usr", "var"};
  if (!strncmp(real, "/var/tmp/", 9) || !strncmp(real, "/dev/shm/", 9)) return 0;
  const char* top = real[0] == '/' ? real + 1 : real;
  size_t n = strcspn(top, "/");
  if (n == 0 || (n >= 3 && !strncmp(top, "lib", 3))) return 1;
  for (size_t i = 0; i < sizeof tops / sizeof tops[0]; i++)
    if (strlen(tops[i]) == n && !strncmp(top, tops[i], n)) return 1;
  return 0;
}

/* The real path of the directory open as fd (whatever symlinks its parents went through), from
 * /proc/self/fd, else from realpath(path). 0 on success. */
static int real_path(int fd, const char* path, char* out, size_t size) {
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, out, size - 1);
  if (n > 0 && (size_t)n < size - 1) {
    out[n] = 0;
    return 0;
  }
  char* r = realpath(path, NULL);
  int ok = r && strlen(r) < size;
  if (ok) strcpy(out, r);
  free(r);
  return ok ? 0 : -1;
}

/* Creates the log directory, its last component only (0700), if its parent exists, is no system
 * directory, and nobody but its owner can write to it unless it is sticky like /tmp (elsewhere
 * another user could rename ours away and put theirs in its place). The O_PATH descriptor of the
 * new directory (or of one that appeared meanwhile: the caller checks it), or -1 after a warning. */
static int make_dir(const char* dir) {
  char path[PATH_MAX], real[PATH_MAX];
  size_t len = strlen(dir);
  while (len > 1 && dir[len - 1] == '/') len--;
  if (len >= sizeof path) {
    warn_once(dir, "create the directory for the", strerror(ENAMETOOLONG));
    return -1;
  }
  memcpy(path, dir, len);
  path[len] = 0;
  char* slash = strrchr(path, '/');
  const char* parent = ".";
  const char* leaf = path;
  if (slash) {
    *slash = 0;
    leaf = slash + 1;
    parent = slash == path ? "/" : path;
  }
  int pfd = open(parent, O_PATH | O_DIRECTORY | O_CLOEXEC); /* symlinks above the leaf are followed */
  if (pfd < 0) {
    warn_once(dir, "create the directory for the",
              errno == ENOENT ? "its parent does not exist (only the last directory is ever created)" : strerror(errno));
    return -1;
  }
  struct stat st;
  const char* why = NULL;
  size_t rl;
  if (fstat(pfd, &st) != 0) why = strerror(errno);
  else if ((st.st_mode & 022) && !(st.st_mode & S_ISVTX)) why = "group or others can write to its parent";
  else if (geteuid() == 0) { /* the new directory would be root's */
    if (real_path(pfd, parent, real, sizeof real) != 0) why = "the real path of its parent is unknown";
    else if ((rl = strlen(real)) + strlen(leaf) + 2 > sizeof real) why = strerror(ENAMETOOLONG);
    else {
      snprintf(real + rl, sizeof real - rl, "%s%s", rl && real[rl - 1] == '/' ? "" : "/", leaf);
      if (system_dir(real)) why = "it is a system directory";
    }
  }
  if (!why && mkdirat(pfd, leaf, 0700) != 0 && errno != EEXIST) why = strerror(errno);
  int dfd = -1;
  if (!why && (dfd = openat(pfd, leaf, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) why = strerror(errno);
  close(pfd);
  if (why) warn_once(dir, "create the directory for the", why);
  return dfd;
}

/* The checked directory, opened now or kept from an earlier open; -1 after a warning. */
static int log_dir_fd(const char* dir) {
  struct stat st;
  if (g_dirfd >= 0 && fstat(g_dirfd, &st) == 0 && st.st_dev == g_ddev && st.st_ino == g_dino) return g_dirfd;
  /* Gone, or the host closed it and reused the number (then it is the host's: left alone). */
  g_dirfd = -1;
  if (!dir) return -1; /* NCCLPROBE_DIR unset since the first open, and the directory lost */
  int dfd = open(dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0 && errno == ENOENT) {
    dfd = make_dir(dir);
    if (dfd < 0) return -1;
  } else if (dfd < 0) {
    /* O_NOFOLLOW with O_DIRECTORY: a symlink fails with ENOTDIR, like a file */
    int e = errno;
    struct stat lst;
    warn_once(dir, "use the directory for the",
              e == ENOTDIR && lstat(dir, &lst) == 0 && S_ISLNK(lst.st_mode) ? "it is a symlink" : strerror(e));
    return -1;
  }
  dfd = move_high(dfd);
  char real[PATH_MAX];
  const char* why = NULL;
  if (fstat(dfd, &st) != 0 || !S_ISDIR(st.st_mode)) why = "not a directory";
  else if (st.st_uid != geteuid()) why = "it belongs to another user";
  else if (st.st_mode & 022) why = "group or others can write to it";
  else if (st.st_uid == 0 && real_path(dfd, dir, real, sizeof real) != 0) why = "its real path is unknown";
  else if (st.st_uid == 0 && system_dir(real)) why = "it is a system directory";
  if (why) {
    close(dfd);
    warn_once(dir, "use the directory for the", why);
    return -1;
  }
  g_dirfd = dfd;
  g_ddev = st.st_dev;
  g_dino = st.st_ino;
  return dfd;
}

static void open_locked(void) {
  const char* dir = getenv("NCCLPROBE_DIR");
  if (dir && !*dir) dir = NULL;
  if (!dir && g_dirfd < 0) {
    g_state = ST_SILENT;
    return;
  }
  if (gethostname(g_host, sizeof g_host - 1) != 0) strcpy(g_host, "unknown");
  g_host[sizeof g_host - 1] = 0;
  /* A host name never contains '/', but a file name must not, whatever uname says. */
  char safe[256];
  size_t i;
  for (i = 0; g_host[i] && i < sizeof safe - 1; i++) safe[i] = g_host[i] == '/' ? '_' : g_host[i];
  safe[i] = 0;
  np_json_escape(g_host, strlen(g_host), g_hostq, sizeof g_hostq);

  pid_t pid = getpid();
  char name[300];
  snprintf(name, sizeof name, "%s-%d.jsonl", safe, (int)pid);
  int dfd = log_dir_fd(dir);
  if (dfd < 0) {
    g_state = ST_SILENT; /* warned once, or nothing left to write to */
    return;
  }
  if (!dir) dir = "the kept NCCLPROBE_DIR";
  int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0600);
  if (fd < 0) {
    warn_once(dir, "open the", errno == ENXIO ? "a FIFO sits at the log file's name" : strerror(errno));
    return;
  }
  fd = move_high(fd);
  struct stat st;
  int fl;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) ||
      (fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    close(fd);
    warn_once(dir, "use the", "the file at its name is not a private regular file of this user");
    return;
  }
  g_fd = fd;
  g_pid = pid;
  g_dev = st.st_dev;
  g_ino = st.st_ino;
  g_state = ST_OPEN;
}

/* The usable descriptor, or -1. Cheap when nothing changed: one getpid() and one fstat(). */
static int log_fd(void) {
  if (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) == ST_SILENT) return -1;
  pid_t pid = getpid();
  int fd = __atomic_load_n(&g_fd, __ATOMIC_ACQUIRE);
  if (fd >= 0 && g_pid == pid) {
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_dev == g_dev && st.st_ino == g_ino) return fd;
  }
  pthread_mutex_lock(&g_lock);
  if (g_state != ST_SILENT) {
    struct stat st;
    int ours = g_fd >= 0 && fstat(g_fd, &st) == 0 && st.st_dev == g_dev && st.st_ino == g_ino;
    if (!ours || g_pid != pid) {
      /* Still our file but another pid: a copy inherited through a fork that ran no atfork
       * handler (raw clone); close it. Not our file any more: the host closed it and reused the
       * number, so it is the host's descriptor and must be left alone. */
      if (ours) close(g_fd);
      g_fd = -1;
      open_locked();
    }
  }
  fd = g_state == ST_OPEN ? g_fd : -1;
  pthread_mutex_unlock(&g_lock);
  return fd;
}

int np_log_enabled(void) { return log_fd() >= 0; }

void np_event_begin(np_jb* jb, const char* ev, const char* src) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  char head[160];
  int n = snprintf(head, sizeof head, "{\"ev\":\"%s\",\"t\":%lld.%06ld,\"pid\":%d,\"src\":\"%s\",\"host\":\"", ev,
                   (long long)ts.tv_sec, ts.tv_nsec / 1000, (int)getpid(), src);
  if (n < 0 || (size_t)n >= sizeof head) { /* cut or failed: no line at all (np_event_end drops it) */
    jb->full = 1;
    return;
  }
  np_jb_raw(jb, head, (size_t)n);
  np_jb_raw(jb, g_hostq, strlen(g_hostq));
  np_jb_raw(jb, "\"", 1);
}

void np_event_end(np_jb* jb) {
  if (jb->len == 0) return; /* np_event_begin could not start the line */
  int fd = log_fd();
  if (fd < 0) return;
  /* The reserved tail always fits the closing marker and newline (NP_JB_TAIL). */
  const char* tail = jb->truncated ? ",\"truncated\":true}\n" : "}\n";
  size_t tl = strlen(tail);
  memcpy(jb->buf + jb->len, tail, tl);
  size_t len = jb->len + tl, off = 0;
  while (off < len) {
    ssize_t w = write(fd, jb->buf + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break; /* disk full: drop the line, never block or crash the host */
    off += (size_t)w;
  }
}

void np_probe_error(const char* src, const char* part, int* once, const char* message) {
  if (once && __atomic_exchange_n(once, 1, __ATOMIC_RELAXED)) return;
  if (!np_log_enabled()) return;
  char buf[2048];
  np_jb jb;
  np_jb_init(&jb, buf, sizeof buf);
  np_event_begin(&jb, "probe_error", src);
  np_jb_str(&jb, "message", message);
  np_jb_str(&jb, "part", part);
  np_event_end(&jb);
}
