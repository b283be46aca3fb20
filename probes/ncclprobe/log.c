/* log.c - the per-process JSONL file <NCCLPROBE_DIR>/<host>-<pid>.jsonl, as the writer thread
 * (writer.c) opens, checks and writes it. No host thread calls anything here but np_log_setup.
 *
 * The names are predictable, so only a private place is used: the directory must be a real
 * directory (not a symlink) of our effective uid that neither group nor others can write to
 * (NCCLPROBE_DIR=/tmp is refused: another user could plant a FIFO or a file of theirs at our
 * name) and, for root (who owns them), no system directory (/etc, /usr, ...); a missing one is
 * created, its last component only, in a parent fit for it. The file must be a regular file of
 * ours that nobody else can read or write. It is opened O_NONBLOCK (a FIFO without a reader fails
 * at once, and with one fails the regular-file check). The directory stays open and files are
 * opened relative to it, so a relative NCCLPROBE_DIR keeps naming the same directory after the
 * host chdir()s (fork children open their own file there). An unusable directory costs one
 * stderr warning, then silence.
 *
 * Descriptors: kept at NP_FD_FLOOR or above (hosts dup2() onto and close() in loops the low
 * numbers), never on 0-2 (a host started with stdio closed would write its "stdout" into our
 * file); each write is preceded by an fstat proving the descriptor still names the file we opened
 * (a host that closed every fd and reused the number must never receive our lines, nor lose its
 * descriptor to our close).
 *
 * Bounds (issue 21, the boot probe keeps the same): NCCLPROBE_MAX_LINE bytes a line (np_jb cuts
 * members and says "truncated"); NCCLPROBE_MAX_BYTES a file: the line that would pass
 * MAX_BYTES - 1024 is replaced by one log_budget line, then nothing more; NCCLPROBE_MAX_FILES log
 * files per host in a directory, counted by appending one byte to <host>.files before creating
 * one. Lines lost (full queue, failed write) are counted and said as "dropped": K in the next
 * line written. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "probe.h"

#define NP_FD_FLOOR 200
#define NP_BUDGET_MARGIN 1024 /* the budget line fits in what MAX_BYTES leaves above this */

size_t np_line_cap = 65536 - NP_DROPPED_ROOM;
static unsigned long long g_max_bytes = 64ull << 20;
static unsigned long long g_max_files = 4096;
char np_hostq[600]; /* host, JSON-escaped */
static char g_safe[256]; /* host as a file name */

static int g_fd = -1; /* the file, its process and identity */
static pid_t g_fd_pid;
static dev_t g_dev;
static ino_t g_ino;
static int g_dirfd = -1; /* the checked log directory (O_PATH), kept for re-opens */
static dev_t g_ddev;
static ino_t g_dino;
static int g_torn; /* the last write was short: the next line starts with a newline */
static int g_refused; /* warned once; silent in this process and its fork children */
static int g_over_files; /* the file is the first past the file budget */

/* A decimal knob of at least `min`; unset or anything else: the default (issue 21's policy). */
static unsigned long long knob(const char* name, unsigned long long dflt, unsigned long long min) {
  char s[32];
  ssize_t got = np_env_value(name, s, sizeof s); /* (not getenv: a host thread may race it, probe.h) */
  if (got < 0 || got >= (ssize_t)sizeof s || *s < '0' || *s > '9') return dflt;
  char* end;
  int saved = errno;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  int bad = errno || *end || v < min || v > (1ull << 50);
  errno = saved;
  return bad ? dflt : v;
}

void np_log_setup(void) {
  /* A line must hold the common fields; a file must hold a line and the budget line. */
  size_t line = (size_t)knob("NCCLPROBE_MAX_LINE", 65536, 1024);
  np_line_cap = line - NP_DROPPED_ROOM;
  g_max_bytes = knob("NCCLPROBE_MAX_BYTES", 64ull << 20, 4 * NP_BUDGET_MARGIN);
  g_max_files = knob("NCCLPROBE_MAX_FILES", 4096, 1);
  char host[256];
  if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "unknown");
  host[sizeof host - 1] = 0;
  /* A host name never contains '/', but a file name must not, whatever uname says. */
  size_t i;
  for (i = 0; host[i] && i < sizeof g_safe - 1; i++) g_safe[i] = host[i] == '/' ? '_' : host[i];
  g_safe[i] = 0;
  np_json_escape(host, strlen(host), np_hostq, sizeof np_hostq);
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

/* One line, then silence for the life of the process (and its fork children). Written by the
 * writer thread, whose signals are blocked: a closed pipe gives EPIPE, not the host's SIGPIPE. */
static void warn_once(const char* dir, const char* what, const char* why) {
  g_refused = 1;
  if (!stderr_usable()) return;
  char msg[1200];
  int n = snprintf(msg, sizeof msg, "ncclprobe: cannot %s log in %s: %s; the probe stays silent\n", what, dir, why);
  if (n > 0) {
    ssize_t w = write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
    (void)w;
  }
}

/* fd moved to NP_FD_FLOOR or above (RLIMIT_NOFILE may forbid that: then anything above 2), or
 * -1 (closed) rather than a descriptor on 0-2, where the host's stdio output would land. */
static int keep_high(int fd) {
  int high = fcntl(fd, F_DUPFD_CLOEXEC, NP_FD_FLOOR);
  if (high < 0 && fd < 3) high = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (high >= 0) {
    close(fd);
    return high;
  }
  if (fd >= 3) return fd;
  close(fd);
  return -1;
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

/* Whether fd still names the file (dev, ino) we opened: if not, the host closed ours and the
 * number is the host's now. */
static int same_file(int fd, dev_t dev, ino_t ino, struct stat* st) {
  return fd >= 0 && fstat(fd, st) == 0 && st->st_dev == dev && st->st_ino == ino;
}

/* The kept directory if it is still ours; else the one at `dir` (NULL: none), checked. -1 when
 * there is none (refused after a warning, or nothing left to open). */
static int log_dir_fd(const char* dir) {
  struct stat st;
  if (same_file(g_dirfd, g_ddev, g_dino, &st)) return g_dirfd;
  g_dirfd = -1; /* gone, or the number is the host's now: left alone */
  if (!dir) return -1;
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
  char real[PATH_MAX];
  const char* why = NULL;
  if ((dfd = keep_high(dfd)) < 0) why = "no descriptor above 2 is free";
  else if (fstat(dfd, &st) != 0 || !S_ISDIR(st.st_mode)) why = "not a directory";
  else if (st.st_uid != geteuid()) why = "it belongs to another user";
  else if (st.st_mode & 022) why = "group or others can write to it";
  else if (st.st_uid == 0 && real_path(dfd, dir, real, sizeof real) != 0) why = "its real path is unknown";
  else if (st.st_uid == 0 && system_dir(real)) why = "it is a system directory";
  if (why) {
    if (dfd >= 0) close(dfd);
    warn_once(dir, "use the directory for the", why);
    return -1;
  }
  g_dirfd = dfd;
  g_ddev = st.st_dev;
  g_dino = st.st_ino;
  return dfd;
}

/* The file budget: this process's place among the log files created in the directory, from the
 * end offset of one byte appended to <host>.files (O_APPEND: our own byte's end, whatever others
 * appended meanwhile); past MAX_FILES + 1 nothing is appended, so the counter stays bounded too.
 * -1: the counter is not a private regular file of ours (then no file is created). */
static long long file_number(int dfd) {
  char name[300];
  snprintf(name, sizeof name, "%s.files", g_safe);
  int fd = openat(dfd, name, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, 0600);
  if (fd < 0 || (fd = keep_high(fd)) < 0) return -1;
  struct stat st;
  long long n = -1;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 077)) {
    if ((unsigned long long)st.st_size > g_max_files) n = (long long)st.st_size + 1;
    else if (write(fd, "\n", 1) == 1) n = (long long)lseek(fd, 0, SEEK_CUR);
  }
  close(fd);
  return n;
}

/* The budget line (reached "bytes" or "files"), written as the file's last line. */
static void write_budget_line(int fd, const char* src, const char* reached, unsigned long long limit,
                              unsigned long long dropped) {
  char buf[1024];
  np_jb jb;
  np_jb_init(&jb, buf, sizeof buf);
  np_event_begin(&jb, "log_budget", src);
  np_jb_str(&jb, "reached", reached);
  np_jb_uint(&jb, "limit", limit);
  if (dropped) np_jb_uint(&jb, "dropped", dropped);
  size_t n = np_event_finish(&jb);
  if (n && write(fd, buf, n) != (ssize_t)n) g_torn = 1;
}

/* Opens this process's file in dfd: an existing one only if it is a private regular file of ours;
 * a new one only within the file budget. NP_FILE_OK, or what to do instead. */
static int open_file(int dfd, const char* dir) {
  char name[300];
  pid_t pid = getpid();
  snprintf(name, sizeof name, "%s-%d.jsonl", g_safe, (int)pid);
  const int flags = O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
  int fd = openat(dfd, name, flags);
  long long number = 0;
  if (fd < 0 && errno == ENOENT) {
    number = file_number(dfd);
    if (number < 0 || (unsigned long long)number > g_max_files + 1) return NP_FILE_FILES;
    fd = openat(dfd, name, flags | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno == EEXIST) fd = openat(dfd, name, flags); /* appeared meanwhile: checked below */
  }
  if (fd < 0) {
    warn_once(dir, "open the", errno == ENXIO ? "a FIFO sits at the log file's name" : strerror(errno));
    return NP_FILE_REFUSED;
  }
  struct stat st;
  if ((fd = keep_high(fd)) < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 077)) {
    if (fd >= 0) close(fd);
    warn_once(dir, "use the", "the file at its name is not a private regular file of this user");
    return NP_FILE_REFUSED;
  }
  g_over_files = (unsigned long long)number == g_max_files + 1; /* it holds one budget line only */
  g_fd = fd;
  g_fd_pid = pid;
  g_dev = st.st_dev;
  g_ino = st.st_ino;
  g_torn = 0;
  return NP_FILE_OK;
}

int np_file_open(const char* dir) {
  if (g_refused) return NP_FILE_REFUSED;
  int dfd = log_dir_fd(dir);
  if (dfd < 0) return g_refused ? NP_FILE_REFUSED : NP_FILE_LOST;
  return open_file(dfd, dir ? dir : "the kept NCCLPROBE_DIR");
}

/* The descriptor if it still names our file in this process (st filled), else -1; our own file
 * inherited by a process that ran no fork handler (a raw clone) is closed, the host's never. */
static int usable_fd(struct stat* st) {
  if (!same_file(g_fd, g_dev, g_ino, st)) {
    g_fd = -1;
    return -1;
  }
  if (g_fd_pid != getpid()) {
    close(g_fd);
    g_fd = -1;
  }
  return g_fd;
}

/* ,"dropped":K spliced in before the closing brace (the line has NP_DROPPED_ROOM spare bytes). */
static size_t say_dropped(char* line, size_t n, unsigned long long k) {
  char add[NP_DROPPED_ROOM];
  int l = snprintf(add, sizeof add, ",\"dropped\":%llu}\n", k);
  if (l <= 0 || (size_t)l >= sizeof add || n < 2) return n;
  memcpy(line + n - 2, add, (size_t)l);
  return n - 2 + (size_t)l;
}

int np_file_write(char* line, size_t n, const char* src, unsigned long long* dropped) {
  struct stat st;
  int fd = usable_fd(&st);
  if (fd < 0) {
    int r = np_file_open(NULL); /* the kept directory, if it is still ours */
    if (r != NP_FILE_OK) return r;
    if ((fd = usable_fd(&st)) < 0) return NP_FILE_LOST;
  }
  if (g_over_files) { /* the first file past the file budget: the first line says so, instead */
    write_budget_line(fd, src, "files", g_max_files, 0);
    return NP_FILE_FILES;
  }
  unsigned long long k = __atomic_exchange_n(dropped, 0, __ATOMIC_RELAXED);
  if (k) n = say_dropped(line, n, k);
  int ending = g_torn; /* a torn line before: this one starts with the newline that ends it */
  if (ending) { /* the caller keeps line[-1] for this */
    *--line = '\n';
    n++;
  }
  if ((unsigned long long)st.st_size + n > g_max_bytes - NP_BUDGET_MARGIN) {
    write_budget_line(fd, src, "bytes", g_max_bytes, k);
    return NP_FILE_BYTES;
  }
  ssize_t w = write(fd, line, n); /* one write() a line: O_APPEND keeps concurrent writers apart */
  if (w == (ssize_t)n) {
    g_torn = 0;
    return NP_FILE_OK;
  }
  if (w > 0) g_torn = w > ending; /* ENOSPC or RLIMIT_FSIZE part way: a part of this line, torn */
  if (w < (ssize_t)n - 1) /* all but its newline: the line is read whole once the next one ends it */
    __atomic_add_fetch(dropped, k + 1, __ATOMIC_RELAXED);
  return NP_FILE_OK;
}

void np_file_close(void) {
  struct stat st;
  if (usable_fd(&st) >= 0) close(g_fd);
  g_fd = -1;
}

int np_file_has_dir(void) { return __atomic_load_n(&g_dirfd, __ATOMIC_RELAXED) >= 0; }

int np_file_refuse(const char* dir, const char* why) {
  warn_once(dir, "use the directory for the", why);
  return NP_FILE_REFUSED;
}

/* Fork child (async-signal-safe: fstat and close only). Its parent's file is closed only if the
 * descriptor still is that file; the number may belong to the host now (a daemon's close-all and
 * re-open, a pre-fork server's socket dup2()ed there), and then it stays the host's. The kept
 * directory stays: the child opens its own file there, after checking it the same way. */
void np_file_forget_in_child(void) {
  struct stat st;
  if (same_file(g_fd, g_dev, g_ino, &st)) close(g_fd);
  g_fd = -1;
  g_torn = 0;
}

int np_file_refused(void) { return g_refused; }

/* A fork or vfork child's own line (spawn.c), written async-signal-safely: no malloc, no stdio, no lock,
 * no global written (a vfork child shares them with its parent). The directory is the one this process
 * kept, if fstat proves it still is (else NCCLPROBE_DIR, checked as log_dir_fd checks it, never created);
 * the file is this pid's, created O_EXCL or re-opened only as a private regular file of ours, O_NONBLOCK
 * and O_NOFOLLOW; one write(), then closed. Returns 1 when the whole line was written. */
/* NCCLPROBE_DIR as the process had it when the library loaded: `env -i`, clearenv() or an allow-list
 * built in place empty the environment before the very exec whose line np_file_child_write writes. */
static char g_dir_at_load[PATH_MAX];

__attribute__((constructor)) static void keep_dir(void) {
  ssize_t l = np_env_value("NCCLPROBE_DIR", g_dir_at_load, sizeof g_dir_at_load);
  if (l <= 0 || l >= (ssize_t)sizeof g_dir_at_load) g_dir_at_load[0] = 0; /* unset, empty or longer than a path */
}

int np_file_child_write(const char* line, size_t n) {
  struct stat st;
  int dfd = g_dirfd, own = 0;
  if (!same_file(dfd, g_ddev, g_dino, &st)) {
    char now[PATH_MAX];
    ssize_t got = g_refused ? -1 : np_env_value("NCCLPROBE_DIR", now, sizeof now);
    const char* dir = got > 0 && got < (ssize_t)sizeof now ? now : NULL;
    if (!dir && !g_refused && g_dir_at_load[0] && got < (ssize_t)sizeof now) dir = g_dir_at_load;
    if (!dir || !*dir || (dfd = open(dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) return 0;
    own = 1;
    char real[PATH_MAX], link[32] = "/proc/self/fd/";
    size_t l = 14;
    char d[12];
    int k = 0;
    for (unsigned u = (unsigned)dfd; k == 0 || u; u /= 10) d[k++] = (char)('0' + u % 10);
    while (k) link[l++] = d[--k];
    link[l] = 0;
    ssize_t r;
    if (fstat(dfd, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022) ||
        (st.st_uid == 0 && ((r = readlink(link, real, sizeof real - 1)) <= 0 || (real[r] = 0, system_dir(real))))) {
      close(dfd);
      return 0;
    }
  }
  char name[300], host[256];
  size_t l = 0;
  if (g_safe[0]) {
    l = strlen(g_safe);
    memcpy(name, g_safe, l);
  } else {
    if (gethostname(host, sizeof host - 1) != 0) memcpy(host, "unknown", 8);
    host[sizeof host - 1] = 0;
    for (; host[l] && l < 255; l++) name[l] = host[l] == '/' ? '_' : host[l];
  }
  name[l++] = '-';
  char d[12];
  int k = 0;
  for (unsigned u = (unsigned)getpid(); k == 0 || u; u /= 10) d[k++] = (char)('0' + u % 10);
  while (k) name[l++] = d[--k];
  memcpy(name + l, ".jsonl", 7);
  const int flags = O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
  int fd = openat(dfd, name, flags | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST) fd = openat(dfd, name, flags);
  int ok = 0;
  if (fd >= 0) {
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 077) &&
        (unsigned long long)st.st_size + n <= g_max_bytes - NP_BUDGET_MARGIN)
      ok = write(fd, line, n) == (ssize_t)n;
    close(fd);
  }
  if (own) close(dfd);
  return ok;
}
