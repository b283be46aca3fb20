/* writer.c - how a line gets from a host thread to the log file without ever blocking the host.
 *
 * A write() to a filesystem that stalls (a hung NFS server, a frozen ext4: fsfreeze) sleeps
 * uninterruptibly until it recovers, and pwritev2(RWF_NOWAIT) is no way out: ext4 refuses it for
 * buffered writes (EOPNOTSUPP), and a frozen filesystem is waited for in file_start_write() before
 * the flag is even looked at (fs/read_write.c vfs_writev); open(O_CREAT) and mkdir wait the same
 * way (mnt_want_write). So no host thread ever touches the log's filesystem. Each line goes into a
 * bounded in-memory queue; one writer thread per process (started at the first event, and again
 * in a fork child, which has no copy of it) opens, checks and writes, one write() per line.
 *  - A host thread waits for its own line at most NP_SYNC_NS, so that the line is in the file when
 *    the hook returns (a fork child that _exit()s, a daemon that closes every fd right after would
 *    lose it otherwise; the hand-off costs ~20 us a line on an idle machine), and not at all once
 *    the writer has been stuck NP_SYNC_NS on one call: a stall costs the host one such wait, then
 *    nothing. The profiler's periodic flushes (the collective path, the flusher thread) never
 *    wait. A full queue drops the line and counts it; the next line written says "dropped": K.
 *  - The first event of a process waits at most NP_OPEN_NS for the file to be opened, so that an
 *    unusable directory still makes the probe silent (and the profiler ask NCCL for nothing).
 *  - Exit waits at most NP_EXIT_NS for the queue, stuck writer or not (a destructor that runs
 *    after the profiler's exit flush: priority 101 runs last).
 *  - No probe lock is held across a write, an open or a wait, so fork() never waits on the
 *    filesystem; the atfork handlers take the probe's other locks (held for a few stores each),
 *    and the child re-creates the queue and its lock rather than inherit them from threads it
 *    does not have.
 * What a stall can still cost: the writer thread sleeps in the kernel until the filesystem
 * recovers, and a process that exits meanwhile is reaped only then (its own threads have all
 * finished). The writer blocks every signal: a RLIMIT_FSIZE or closed-pipe signal raised by its
 * writes stays pending on it instead of killing the host. */
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "probe.h"

enum { ST_UNKNOWN = 0, ST_OPENING, ST_OPEN, ST_SILENT };

#define NP_QUEUE (512u * 1024u) /* bytes of lines waiting; a finalize flush of 256 shapes is ~120 kB */
#define NP_SYNC_NS 50000000ull
#define NP_OPEN_NS 100000000ull
#define NP_EXIT_NS 100000000ull

struct qent { /* a queued line: this header, then the line, padded to 16 bytes */
  uint32_t len; /* NP_SKIP: the rest of the ring is unused, the next entry is at its start */
  uint32_t pad;
  const char* src;
};
#define NP_SKIP UINT32_MAX
#define QALIGN(n) (((n) + 15u) & ~(size_t)15u)

static int g_state;            /* ST_* of the process g_owner */
static int g_why;              /* the np_file_* result that made it silent */
static pid_t g_owner;
static pid_t g_writer;         /* the process whose writer thread runs (0: none) */
static pthread_mutex_t g_qlock = PTHREAD_MUTEX_INITIALIZER; /* the ring's indices, a few stores */
static char g_q[NP_QUEUE] __attribute__((aligned(16)));
static uint64_t g_qhead, g_qtail; /* bytes queued, bytes taken by the writer */
static uint64_t g_qdone;          /* bytes the writer is finished with */
static uint32_t g_wake;           /* futex: bumped when there is work */
static int g_sleeping;            /* the writer waits on g_wake */
static uint32_t g_progress;       /* futex: bumped when the writer finished something */
static uint64_t g_busy_since;     /* when the writer's current open or write began; 0: idle */
static uint64_t g_open_since;     /* when the open under way was asked for */
static unsigned long long g_dropped;
static char g_dir[4096];          /* NCCLPROBE_DIR as the requesting thread read it; "" none */
static int g_dir_long;            /* it was longer than any path (g_dir holds its start) */
static char g_wbuf[1 + NP_LINE_MAX + NP_DROPPED_ROOM]; /* the writer's line; [0] for a newline */
static pthread_once_t g_setup_once = PTHREAD_ONCE_INIT;
__thread int np_tl_nowait;

uint64_t np_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void futex_wait(uint32_t* word, uint32_t seen, uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
}

static void futex_wake(uint32_t* word) { syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0); }

static int state(void) { return __atomic_load_n(&g_state, __ATOMIC_ACQUIRE); }
static void set_state(int st) { __atomic_store_n(&g_state, st, __ATOMIC_RELEASE); }

/* ---------------------------------------------------------------- the ring (under g_qlock) */

static int push(const char* line, size_t n, const char* src) {
  size_t need = sizeof(struct qent) + QALIGN(n);
  size_t off = (size_t)(g_qhead % NP_QUEUE), to_end = NP_QUEUE - off;
  size_t total = need + (to_end < need ? to_end : 0);
  if (n > NP_LINE_MAX || g_qhead - g_qtail + total > NP_QUEUE) return 0;
  if (to_end < need) {
    ((struct qent*)(g_q + off))->len = NP_SKIP;
    g_qhead += to_end;
    off = 0;
  }
  struct qent* e = (struct qent*)(g_q + off);
  e->len = (uint32_t)n;
  e->src = src;
  memcpy(e + 1, line, n);
  __atomic_store_n(&g_qhead, g_qhead + need, __ATOMIC_RELEASE);
  return 1;
}

/* The oldest line copied into out; 0 when the queue is empty. */
static int pop(char* out, size_t* n, const char** src) {
  while (g_qtail != g_qhead) {
    struct qent* e = (struct qent*)(g_q + g_qtail % NP_QUEUE);
    if (e->len == NP_SKIP) {
      g_qtail += NP_QUEUE - g_qtail % NP_QUEUE;
      continue;
    }
    *n = e->len;
    *src = e->src;
    memcpy(out, e + 1, e->len);
    g_qtail += sizeof *e + QALIGN(e->len);
    return 1;
  }
  return 0;
}

/* ---------------------------------------------------------------- the writer thread */

static void progress(void) {
  __atomic_add_fetch(&g_progress, 1, __ATOMIC_SEQ_CST);
  futex_wake(&g_progress);
}

static void go_silent(int why) {
  g_why = why;
  set_state(ST_SILENT);
  np_file_close();
  pthread_mutex_lock(&g_qlock);
  g_qtail = g_qhead; /* nothing queued will be written */
  __atomic_store_n(&g_qdone, g_qhead, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&g_qlock);
}

static void after_file_call(int r) {
  if (r == NP_FILE_LOST) { /* the directory is gone too: the next event asks NCCLPROBE_DIR again */
    __atomic_add_fetch(&g_dropped, 1, __ATOMIC_RELAXED);
    set_state(ST_UNKNOWN);
  } else if (r != NP_FILE_OK) {
    go_silent(r);
  }
}

static void open_requested(void) {
  __atomic_store_n(&g_busy_since, np_now_ns(), __ATOMIC_RELAXED);
  int r = g_dir_long ? np_file_refuse(g_dir, "its name is longer than any path") : np_file_open(g_dir[0] ? g_dir : NULL);
  __atomic_store_n(&g_busy_since, 0, __ATOMIC_RELAXED);
  if (r == NP_FILE_OK) set_state(ST_OPEN);
  else go_silent(r); /* LOST here: NCCLPROBE_DIR unset and the kept directory gone */
}

static void write_next(void) {
  size_t n;
  const char* src;
  pthread_mutex_lock(&g_qlock);
  int got = pop(g_wbuf + 1, &n, &src);
  uint64_t taken = g_qtail;
  pthread_mutex_unlock(&g_qlock);
  if (!got) return;
  if (state() == ST_OPEN) {
    __atomic_store_n(&g_busy_since, np_now_ns(), __ATOMIC_RELAXED);
    after_file_call(np_file_write(g_wbuf + 1, n, src, &g_dropped));
    __atomic_store_n(&g_busy_since, 0, __ATOMIC_RELAXED);
  } else if (state() == ST_UNKNOWN) {
    __atomic_add_fetch(&g_dropped, 1, __ATOMIC_RELAXED);
  }
  __atomic_store_n(&g_qdone, taken, __ATOMIC_RELEASE);
}

static int has_work(void) {
  return state() == ST_OPENING || __atomic_load_n(&g_qhead, __ATOMIC_ACQUIRE) != __atomic_load_n(&g_qtail, __ATOMIC_RELAXED);
}

static void* writer_main(void* arg) {
  pid_t me = (pid_t)(intptr_t)arg;
  np_tl_nowait = 1;
  for (;;) {
    if (getpid() != me) return NULL; /* cannot happen: a fork child has no copy of this thread */
    uint32_t seen = __atomic_load_n(&g_wake, __ATOMIC_SEQ_CST);
    if (state() == ST_OPENING) {
      open_requested();
      progress();
      continue;
    }
    if (__atomic_load_n(&g_qhead, __ATOMIC_ACQUIRE) != __atomic_load_n(&g_qtail, __ATOMIC_RELAXED)) {
      write_next();
      progress();
      continue;
    }
    /* Sleeping is announced before the last look: a producer either sees it and wakes us, or
     * bumped g_wake before that look (and the futex then returns at once). */
    __atomic_store_n(&g_sleeping, 1, __ATOMIC_SEQ_CST);
    if (!has_work() && __atomic_load_n(&g_wake, __ATOMIC_SEQ_CST) == seen)
      futex_wait(&g_wake, seen, 1000000000ull);
    __atomic_store_n(&g_sleeping, 0, __ATOMIC_SEQ_CST);
  }
  return NULL;
}

static void wake_writer(void) {
  __atomic_add_fetch(&g_wake, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&g_sleeping, __ATOMIC_SEQ_CST)) futex_wake(&g_wake);
}

/* The writer thread of this process: signals blocked (they are the host's), a small stack. */
static int start_writer(pid_t pid) {
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0) return 0;
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 128 * 1024);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* the new thread inherits the blocked set */
  pthread_t t;
  int ok = pthread_create(&t, &attr, writer_main, (void*)(intptr_t)pid) == 0;
  if (ok) {
    __atomic_store_n(&g_writer, pid, __ATOMIC_RELEASE);
    pthread_setname_np(t, "ncclprobe-log");
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
  return ok;
}

/* ---------------------------------------------------------------- waiting, bounded */

/* Until the writer is done with every line queued before the call, or `limit` passed, or (if
 * `stall_ends` is set) the writer has been stuck NP_SYNC_NS on one call: a stalled filesystem, where
 * waiting would not help. Exit waits its whole bound anyway: the filesystem may just have come
 * back, with the writer not yet scheduled to finish the call it was stuck in. */
static void wait_written(uint64_t limit, int stall_ends) {
  if (__atomic_load_n(&g_writer, __ATOMIC_ACQUIRE) != getpid()) return;
  uint64_t target = __atomic_load_n(&g_qhead, __ATOMIC_ACQUIRE), deadline = np_now_ns() + limit;
  for (;;) {
    uint32_t seen = __atomic_load_n(&g_progress, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&g_qdone, __ATOMIC_ACQUIRE) >= target) return;
    uint64_t now = np_now_ns(), busy = __atomic_load_n(&g_busy_since, __ATOMIC_RELAXED);
    if (now >= deadline || (stall_ends && busy && now > busy + NP_SYNC_NS)) return;
    futex_wait(&g_progress, seen, deadline - now);
  }
}

/* Every thread asking while the open is under way waits for the same deadline: a stalled open
 * costs the host that once. */
static void wait_opened(void) {
  uint64_t deadline = __atomic_load_n(&g_open_since, __ATOMIC_ACQUIRE) + NP_OPEN_NS;
  for (;;) {
    uint32_t seen = __atomic_load_n(&g_progress, __ATOMIC_SEQ_CST);
    uint64_t now = np_now_ns();
    if (state() != ST_OPENING || now >= deadline) return;
    futex_wait(&g_progress, seen, deadline - now);
  }
}

__attribute__((destructor(101))) static void drain_at_exit(void) {
  int saved = errno;
  wait_written(NP_EXIT_NS, 0);
  errno = saved;
}

/* ---------------------------------------------------------------- the host's side */

/* A process that is not the one the state belongs to, and ran no fork handler (a raw clone):
 * it starts over; its copy of our file is closed by its writer if it still is ours. */
static void start_over(pid_t pid) {
  static const pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  memcpy(&g_qlock, &fresh, sizeof fresh); /* a lock held by a thread this process does not have */
  g_qhead = g_qtail = g_qdone = 0;
  g_sleeping = 0;
  g_busy_since = 0;
  g_dropped = 0;
  g_writer = 0;
  /* A refusal or the file budget holds for the children too; the byte budget is per file. */
  if (g_state != ST_SILENT || g_why == NP_FILE_BYTES) g_state = ST_UNKNOWN;
  g_owner = pid;
}

/* Asks the writer to open the file, and waits a bounded time for the answer. */
static int request_open(pid_t pid) {
  pthread_once(&g_setup_once, np_log_setup);
  char now[sizeof g_dir + 1]; /* on the host's thread, as NCCL's own reads; not getenv (probe.h says why) */
  ssize_t got = np_env_value("NCCLPROBE_DIR", now, sizeof now);
  const char* dir = got > 0 ? now : NULL;
  int start = 0;
  pthread_mutex_lock(&g_qlock);
  if (state() == ST_UNKNOWN) {
    if (!dir && !np_file_has_dir()) {
      set_state(ST_SILENT); /* NCCLPROBE_DIR unset: silent, and no thread is started */
    } else {
      /* unset: only a directory kept from before; longer than any path: refused by the writer */
      g_dir_long = dir && (size_t)got >= sizeof g_dir;
      size_t l = !dir ? 0 : g_dir_long ? sizeof g_dir - 1 : (size_t)got; /* (its start, where too long) */
      memcpy(g_dir, now, l);
      g_dir[l] = 0;
      __atomic_store_n(&g_open_since, np_now_ns(), __ATOMIC_RELEASE);
      set_state(ST_OPENING);
      start = __atomic_load_n(&g_writer, __ATOMIC_ACQUIRE) != pid;
    }
  }
  pthread_mutex_unlock(&g_qlock);
  if (state() == ST_SILENT) return 0;
  if (start && !start_writer(pid)) {
    set_state(ST_SILENT); /* no thread to write with: never write from the host's */
    return 0;
  }
  wake_writer();
  wait_opened();
  return state() != ST_SILENT;
}

int np_log_enabled(void) {
  int saved = errno;
  pid_t pid = getpid(), owner = __atomic_load_n(&g_owner, __ATOMIC_ACQUIRE);
  if (owner != pid && __atomic_compare_exchange_n(&g_owner, &owner, pid, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    start_over(pid);
  int st = state();
  if (st == ST_OPENING) wait_opened();
  int on = st == ST_UNKNOWN ? request_open(pid) : state() != ST_SILENT;
  errno = saved;
  return on;
}

/* This process has its own writer thread (not a fork or vfork child about to exec: spawn.c). */
int np_writer_running(void) { return __atomic_load_n(&g_writer, __ATOMIC_ACQUIRE) == getpid(); }

int np_log_active(void) {
  int st = state();
  return (st == ST_OPEN || st == ST_OPENING) && __atomic_load_n(&g_owner, __ATOMIC_ACQUIRE) == getpid();
}

/* The common fields did not fit: no line at all, whatever is appended later (no room, ever). */
static void dead_line(np_jb* jb) {
  jb->len = 0;
  jb->cap = 0;
  jb->full = 1;
}

/* The pid a line names and the line's identity fields, per thread, for the process it was made in (the
 * boot probe's _identity): in the initial pid namespace getpid(); in another, the pid the /proc mounted
 * here shows, with "ns_pid" (getpid()) and "pidns" (the namespace's inode), on which the model joins this
 * process's lines with the boot probe's and the /proc witnesses'. Two readlinks per thread and process. */
static __thread pid_t tl_ident_for;
static __thread pid_t tl_ident_shown;
static __thread char tl_ident_extra[96];

static pid_t line_pid(const char** extra) {
  pid_t pid = getpid();
  if (tl_ident_for != pid) {
    int saved = errno;
    char ns[64], self[32];
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    pid_t shown = pid;
    tl_ident_extra[0] = 0;
    if (n > 6 && (size_t)n < sizeof ns) {
      ns[n] = 0;
      if (strcmp(ns, NP_INIT_PIDNS) != 0 && strncmp(ns, "pid:[", 5) == 0 && ns[n - 1] == ']') {
        ns[n - 1] = 0;
        ssize_t k = readlink("/proc/self", self, sizeof self - 1);
        if (k > 0 && (size_t)k < sizeof self) {
          self[k] = 0;
          long v = strtol(self, NULL, 10);
          if (v > 0) shown = (pid_t)v;
        }
        snprintf(tl_ident_extra, sizeof tl_ident_extra, ",\"ns_pid\":%d,\"pidns\":%s", (int)pid, ns + 5);
      }
    }
    tl_ident_shown = shown;
    tl_ident_for = pid;
    errno = saved;
  }
  *extra = tl_ident_extra;
  return tl_ident_shown;
}

void np_event_begin(np_jb* jb, const char* ev, const char* src) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  jb->src = src;
  if (jb->cap > np_line_cap) jb->cap = np_line_cap; /* NCCLPROBE_MAX_LINE, less room for "dropped" */
  char head[224];
  const char* ident;
  pid_t pid = line_pid(&ident);
  int n = snprintf(head, sizeof head, "{\"ev\":\"%s\",\"t\":%lld.%06ld,\"pid\":%d%s,\"src\":\"%s\",\"host\":\"", ev,
                   (long long)ts.tv_sec, ts.tv_nsec / 1000, (int)pid, ident, src);
  if (n < 0 || (size_t)n >= sizeof head) {
    dead_line(jb);
    return;
  }
  np_jb_raw(jb, head, (size_t)n);
  np_jb_raw(jb, np_hostq, strlen(np_hostq));
  np_jb_raw(jb, "\"", 1);
  if (jb->full) dead_line(jb);
}

size_t np_event_finish(np_jb* jb) {
  if (jb->len == 0) return 0;
  /* The reserved tail always fits the closing marker and newline (NP_JB_TAIL). */
  const char* tail = jb->truncated ? ",\"truncated\":true}\n" : "}\n";
  size_t tl = strlen(tail);
  memcpy(jb->buf + jb->len, tail, tl);
  return jb->len + tl;
}

void np_event_queue(np_jb* jb) {
  size_t n = np_event_finish(jb);
  if (!n) return;
  if (!np_log_active()) { /* the file was lost meanwhile: counted until the next one says so */
    if (state() == ST_UNKNOWN && __atomic_load_n(&g_owner, __ATOMIC_ACQUIRE) == getpid())
      __atomic_add_fetch(&g_dropped, 1, __ATOMIC_RELAXED);
    return;
  }
  pthread_mutex_lock(&g_qlock);
  int queued = push(jb->buf, n, jb->src);
  pthread_mutex_unlock(&g_qlock);
  if (!queued) __atomic_add_fetch(&g_dropped, 1, __ATOMIC_RELAXED);
  wake_writer();
}

void np_event_end(np_jb* jb) {
  int saved = errno;
  np_event_queue(jb);
  if (!np_tl_nowait) wait_written(NP_SYNC_NS, 1);
  errno = saved;
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

/* ---------------------------------------------------------------- fork */

/* The probe's other locks, in the order probe.h gives: a child never inherits one held by a thread
 * it does not have. Each is held for a few stores or a line's formatting, never across I/O. */
static void atfork_prepare(void) {
  pthread_mutex_lock(&np_reg_lock);
  pthread_mutex_lock(&np_cache_lock);
  pthread_mutex_lock(&np_libs_lock);
  pthread_mutex_lock(&np_seen_lock);
}
static void atfork_parent(void) {
  pthread_mutex_unlock(&np_seen_lock);
  pthread_mutex_unlock(&np_libs_lock);
  pthread_mutex_unlock(&np_cache_lock);
  pthread_mutex_unlock(&np_reg_lock);
}
/* Async-signal-safe (a multithreaded parent's child may call nothing else): stores, getpid,
 * and the file's fstat-checked close. */
static void atfork_child(void) {
  np_file_forget_in_child();
  start_over(getpid());
  atfork_parent();
}
/* Registered at load (no I/O, no allocation beyond glibc's handler entry): the handlers must be in
 * place before any of the locks can be taken. The library is never unloaded (-z nodelete). */
__attribute__((constructor)) static void register_atfork(void) {
  g_owner = getpid();
  pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}
