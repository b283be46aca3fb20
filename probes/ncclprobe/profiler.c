/* profiler.c - the NCCL profiler plugin role (NCCL_PROFILER_PLUGIN=<this library>).
 *
 * NCCL calls init once per communicator from comm init (v2.30.7-1 src/plugin/profiler.cc,
 * ncclProfilerPluginInit), and it tries ncclProfiler_v<newest> first, so exporting v4..v7 serves
 * NCCL 2.27 through 2.32 with the layout each one passes. We ask only for collective events
 * (ncclProfileColl); their descriptors carry the realized algorithm, protocol and channel count.
 *
 * Hot path (startEvent for a collective): match the (func, algo, proto, nChannels) shape in the
 * communicator's fixed table, bump a counter and the size range. No allocation, no lock, no I/O,
 * no clock read except once every NP_CHECK_EVERY collectives. Lines are written at finalize, at
 * exit, and when NCCLPROBE_FLUSH_S (default 10 s) has passed at one of those clock checks. So the
 * periodic flush is driven by the communicator's own collectives: one that runs fewer than
 * NP_CHECK_EVERY (256) collectives after the interval has passed, or goes idle, writes its counts
 * only at its next check, at finalize or at exit (a reader of a live job sees them late, never
 * lost).
 *
 * Fork and exit: the registry lock is taken only to add or remove a communicator (and by the exit
 * flush); every probe lock is taken around fork() by log.c's atfork handler, and the exit flush
 * waits for it a bounded time, so a fork child's exit() never waits forever. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "probe.h"

#define NP_SHAPES 64        /* distinct shapes per communicator; more are counted as dropped */
#define NP_CHECK_EVERY 256  /* collectives between two clock reads */
#define NP_MAX_COMMS 4096   /* communicators flushed at exit; more still work, flushed at finalize */

struct shape {
  const char* func_p; /* the descriptor's pointers: NCCL passes string literals, so equality of */
  const char* algo_p; /* pointers is the fast match; equal text through other pointers matches */
  const char* proto_p;/* too */
  int nch;
  char func[24], algo[24], proto[16];
  uint64_t bmin, bmax, count; /* since the last flush */
};

struct pctx {
  uint64_t comm_hash;
  pid_t pid; /* a fork child never flushes its parent's counts */
  int rank, nranks;
  int flushing; /* one flush at a time (owner's periodic flush vs the exit flush) */
  int reg;      /* slot in g_reg, -1 if none */
  uint32_t since_check;
  uint64_t last_flush_ns;
  const char* dtype_p;
  uint64_t dtype_size;
  int nshapes, last;
  uint64_t dropped;
  int dropped_reported;
  struct shape shapes[NP_SHAPES];
};

static struct pctx* g_reg[NP_MAX_COMMS];
pthread_mutex_t np_reg_lock = PTHREAD_MUTEX_INITIALIZER; /* add/remove at init/finalize, and exit */
static int g_mask_given; /* some communicator of this process got ncclProfileColl from us */
static uint64_t g_flush_ns;
static pthread_once_t g_flush_once = PTHREAD_ONCE_INIT;

static void read_flush_interval(void) {
  const char* s = getenv("NCCLPROBE_FLUSH_S");
  char* end = NULL;
  double v = s && *s ? strtod(s, &end) : -1;
  if (!s || !*s || !end || *end || !(v >= 0) || v > 1e6) v = 10.0;
  g_flush_ns = (uint64_t)(v * 1e9);
}

/* Element size from ncclDatatypeToString's name (v2.30.7-1 src/collectives.cc): the bit width is
 * the first number in it ("ncclFloat8e4m3" -> 8). The only name without one is "Unknown", which
 * that switch returns for ncclUint8 alone: 1 byte. */
static uint64_t elem_size(const char* dtype) {
  if (!dtype) return 1;
  for (const char* p = dtype; *p; p++) {
    if (*p >= '0' && *p <= '9') {
      unsigned bits = 0;
      while (*p >= '0' && *p <= '9' && bits < 1024) bits = bits * 10 + (unsigned)(*p++ - '0');
      return bits >= 8 ? bits / 8 : 1;
    }
  }
  return 1;
}

static void copy_str(char* dst, size_t cap, const char* src) {
  if (!src) src = "";
  size_t n = strnlen(src, cap - 1);
  memcpy(dst, src, n);
  dst[n] = 0;
}

static int text_eq(const char* stored, const char* s) { return strcmp(stored, s ? s : "") == 0; }

static void flush(struct pctx* c, const char* reason);

static inline void record(struct pctx* c, const char* func, const char* algo, const char* proto, int nch,
                          size_t count, const char* dtype) {
  if (c->dtype_p != dtype) {
    c->dtype_p = dtype;
    c->dtype_size = elem_size(dtype);
  }
  uint64_t bytes = (uint64_t)count * c->dtype_size;
  struct shape* s = &c->shapes[c->last];
  if (c->nshapes == 0 || s->func_p != func || s->algo_p != algo || s->proto_p != proto || s->nch != nch) {
    int i;
    for (i = 0; i < c->nshapes; i++) {
      s = &c->shapes[i];
      if (s->nch != nch) continue;
      if (s->func_p == func && s->algo_p == algo && s->proto_p == proto) break;
      if (text_eq(s->func, func) && text_eq(s->algo, algo) && text_eq(s->proto, proto)) {
        s->func_p = func;
        s->algo_p = algo;
        s->proto_p = proto;
        break;
      }
    }
    if (i == c->nshapes) {
      if (i == NP_SHAPES) {
        c->dropped++;
        goto check;
      }
      s = &c->shapes[i];
      s->func_p = func;
      s->algo_p = algo;
      s->proto_p = proto;
      s->nch = nch;
      copy_str(s->func, sizeof s->func, func);
      copy_str(s->algo, sizeof s->algo, algo);
      copy_str(s->proto, sizeof s->proto, proto);
      s->count = 0;
      s->bmin = UINT64_MAX;
      s->bmax = 0;
      c->nshapes = i + 1;
    }
    c->last = i;
  }
  s->count++;
  if (bytes < s->bmin) s->bmin = bytes;
  if (bytes > s->bmax) s->bmax = bytes;
check:
  if (++c->since_check >= NP_CHECK_EVERY) {
    c->since_check = 0;
    if (np_now_ns() - c->last_flush_ns >= g_flush_ns) flush(c, "periodic");
  }
}

static void jb_nullable(np_jb* jb, const char* key, const char* s) {
  if (s[0]) np_jb_str(jb, key, s);
  else np_jb_null(jb, key);
}

static void flush(struct pctx* c, const char* reason) {
  if (__atomic_exchange_n(&c->flushing, 1, __ATOMIC_ACQUIRE)) return;
  c->last_flush_ns = np_now_ns();
  if (c->pid == getpid() && np_log_enabled()) {
    for (int i = 0; i < c->nshapes; i++) {
      struct shape* s = &c->shapes[i];
      if (!s->count) continue;
      char buf[1024];
      np_jb jb;
      np_jb_init(&jb, buf, sizeof buf);
      np_event_begin(&jb, "coll_summary", "profiler");
      np_jb_id(&jb, "comm_hash", c->comm_hash);
      np_jb_int(&jb, "rank", c->rank);
      jb_nullable(&jb, "func", s->func);
      jb_nullable(&jb, "algo", s->algo);
      jb_nullable(&jb, "proto", s->proto);
      np_jb_int(&jb, "nchannels", s->nch);
      np_jb_uint(&jb, "bytes_min", s->bmin);
      np_jb_uint(&jb, "bytes_max", s->bmax);
      np_jb_uint(&jb, "count", s->count);
      np_jb_str(&jb, "reason", reason);
      np_event_end(&jb);
      s->count = 0;
      s->bmin = UINT64_MAX;
      s->bmax = 0;
    }
    if (c->dropped && !c->dropped_reported) {
      char msg[200], id[NP_ID_CHARS];
      np_id_text(id, c->comm_hash);
      snprintf(msg, sizeof msg, "comm %s: more than %d collective shapes; %llu collectives not summarized", id,
               NP_SHAPES, (unsigned long long)c->dropped);
      np_probe_error("profiler", "coll_summary", &c->dropped_reported, msg);
    }
  }
  __atomic_store_n(&c->flushing, 0, __ATOMIC_RELEASE);
}

/* Counts still in memory when the process exits without destroying its communicators (common:
 * PyTorch programs that skip destroy_process_group). */
__attribute__((destructor)) static void flush_at_exit(void) {
  int saved = errno;
  /* The lock is never held for long (add/remove), and fork() cannot leave it held in a child
   * (atfork, log.c). Still, a child made by a raw clone() runs no atfork handler: after one second
   * the exit flush is given up rather than the exit. */
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += 1;
  if (pthread_mutex_timedlock(&np_reg_lock, &deadline) != 0) {
    errno = saved;
    return;
  }
  for (int i = 0; i < NP_MAX_COMMS; i++)
    if (g_reg[i]) flush(g_reg[i], "exit"); /* a fork child skips its parent's (pid check) */
  pthread_mutex_unlock(&np_reg_lock);
  errno = saved;
}

static void plugin_load(np_lib* lib, const char* plugin) {
  if (!lib || __atomic_exchange_n(&lib->profiler_seen, 1, __ATOMIC_RELAXED)) return;
  char buf[2048];
  np_jb jb;
  np_jb_init(&jb, buf, sizeof buf);
  np_event_begin(&jb, "plugin_load", "profiler");
  np_jb_str(&jb, "plugin", plugin);
  if (lib->version) np_jb_int(&jb, "nccl_version", lib->version);
  else np_jb_null(&jb, "nccl_version");
  np_jb_str(&jb, "lib", lib->path);
  np_event_end(&jb);
}

static ncclResult_t init_impl(void** context, int* mask, const char* commName, uint64_t commHash, int nNodes,
                                int nranks, int rank, const char* plugin, const void* caller) {
  *context = NULL;
  /* The mask is NCCL's global ncclProfilerEventMask, shared by all communicators
   * (src/plugin/profiler.cc). */
  if (!np_log_enabled()) {
    /* Silent: ask NCCL for no events at all, unless an earlier communicator of this process asked
     * for collectives: clearing the global mask would stop its collection too. This one's events
     * come with a NULL context and are ignored. */
    if (!__atomic_load_n(&g_mask_given, __ATOMIC_RELAXED)) *mask = 0;
    return ncclSuccess;
  }
  pthread_once(&g_flush_once, read_flush_interval);
  /* Only collective events, whatever was there before. */
  *mask = ncclProfileColl;
  __atomic_store_n(&g_mask_given, 1, __ATOMIC_RELAXED);
  np_lib* lib = np_lib_of(caller);
  plugin_load(lib, plugin);

  char buf[16384];
  np_jb jb;
  np_jb_init(&jb, buf, sizeof buf);
  np_event_begin(&jb, "comm_plugin_init", "profiler");
  np_jb_id(&jb, "comm_hash", commHash);
  np_jb_str(&jb, "comm_name", commName);
  np_jb_int(&jb, "nnodes", nNodes);
  np_jb_int(&jb, "nranks", nranks);
  np_jb_int(&jb, "rank", rank);
  np_jb_str(&jb, "lib", lib ? lib->path : NULL);
  if (np_tl_call) np_jb_uint(&jb, "call", np_tl_call);
  else np_jb_null(&jb, "call");
  np_jb_str(&jb, "plugin", plugin);
  np_jb_env(&jb); /* as NCCL has it now: includes values NCCL set from nccl.conf files */
  np_event_end(&jb);

  /* Allocation at init is fine (once per communicator); nothing allocates per collective. */
  struct pctx* c = (struct pctx*)calloc(1, sizeof *c);
  if (!c) return ncclSuccess; /* NULL context: events are ignored */
  c->comm_hash = commHash;
  c->pid = getpid();
  c->rank = rank;
  c->nranks = nranks;
  c->last_flush_ns = np_now_ns();
  c->reg = -1;
  pthread_mutex_lock(&np_reg_lock);
  for (int i = 0; i < NP_MAX_COMMS; i++) {
    if (!g_reg[i]) {
      g_reg[i] = c;
      c->reg = i;
      break;
    }
  }
  pthread_mutex_unlock(&np_reg_lock);
  *context = c;
  return ncclSuccess;
}

/* errno as NCCL left it: opening the log on first use can set it (mkdir of an existing dir). */
static ncclResult_t init_common(void** context, int* mask, const char* commName, uint64_t commHash, int nNodes,
                                int nranks, int rank, const char* plugin, const void* caller) {
  int saved = errno;
  ncclResult_t rc = init_impl(context, mask, commName, commHash, nNodes, nranks, rank, plugin, caller);
  errno = saved;
  return rc;
}

static ncclResult_t finalize_impl(void* context) {
  struct pctx* c = (struct pctx*)context;
  if (!c) return ncclSuccess;
  /* Out of the registry under the lock (the exit flush can no longer reach it once we hold it
   * and take it out), then the lines are written without any lock held. */
  pthread_mutex_lock(&np_reg_lock);
  if (c->reg >= 0) g_reg[c->reg] = NULL;
  pthread_mutex_unlock(&np_reg_lock);
  flush(c, "finalize");
  if (c->pid == getpid() && np_log_enabled()) {
    char buf[512];
    np_jb jb;
    np_jb_init(&jb, buf, sizeof buf);
    np_event_begin(&jb, "comm_plugin_finalize", "profiler");
    np_jb_id(&jb, "comm_hash", c->comm_hash);
    np_event_end(&jb);
  }
  free(c);
  return ncclSuccess;
}

static ncclResult_t finalize(void* context) {
  int saved = errno;
  ncclResult_t rc = finalize_impl(context);
  errno = saved;
  return rc;
}

/* NCCL calls stopEvent only for a non-NULL handle (ncclProfilerStopTaskEvents), so everything is
 * done in startEvent and collectives get no handle; the one handle ever returned (v4's group
 * handle) needs no work at stop. */
static ncclResult_t stop_event(void* handle) { return ncclSuccess; }

static ncclResult_t record_state(void* handle, ncclProfilerEventState_t state, ncclProfilerEventStateArgs_v4_t* args) {
  return ncclSuccess;
}

#define CALLER __builtin_extract_return_addr(__builtin_return_address(0))

/* ---- v4 (NCCL 2.27): uint8_t type; init(ctx, mask, commName, commHash, ...) */
static ncclResult_t init_v4(void** context, int* mask, const char* commName, uint64_t commHash, int nNodes,
                            int nranks, int rank, ncclDebugLogger_t logfn) {
  return init_common(context, mask, commName, commHash, nNodes, nranks, rank, "ncclProfiler_v4", CALLER);
}

/* NCCL 2.27 starts a collective's event only under a non-NULL group handle (v2.27.3-1
 * src/plugin/profiler.cc ncclProfilerStartTaskEvents); 2.28+ dropped that condition. */
static char g_group_handle;

static ncclResult_t start_v4(void* context, void** eHandle, ncclProfilerEventDescr_v4_t* d) {
  *eHandle = context && d->type == ncclProfileGroup ? (void*)&g_group_handle : NULL;
  if (context && d->type == ncclProfileColl)
    record((struct pctx*)context, d->coll.func, d->coll.algo, d->coll.proto, d->coll.nChannels, d->coll.count,
           d->coll.datatype);
  return ncclSuccess;
}

/* ---- v5, v6, v7 (NCCL 2.28 / 2.29-2.30 / 2.31+): uint64_t type; init(ctx, commId, mask, ...).
 * The coll member is laid out identically up to `proto` in all three (nccl_abi.h asserts). */
#define NP_PROFILER_VERSION(V)                                                                          \
  static ncclResult_t init_##V(void** context, uint64_t commId, int* mask, const char* commName,         \
                               int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {              \
    return init_common(context, mask, commName, commId, nNodes, nranks, rank, "ncclProfiler_" #V, CALLER); \
  }                                                                                                     \
  static ncclResult_t start_##V(void* context, void** eHandle, ncclProfilerEventDescr_##V##_t* d) {     \
    *eHandle = NULL;                                                                                    \
    if (context && d->type == ncclProfileColl)                                                          \
      record((struct pctx*)context, d->coll.func, d->coll.algo, d->coll.proto, d->coll.nChannels,       \
             d->coll.count, d->coll.datatype);                                                          \
    return ncclSuccess;                                                                                 \
  }
NP_PROFILER_VERSION(v5)
NP_PROFILER_VERSION(v6)
NP_PROFILER_VERSION(v7)
#undef NP_PROFILER_VERSION

NP_EXPORT const ncclProfiler_v4_t ncclProfiler_v4 = {"ncclprobe", init_v4, start_v4, stop_event, record_state, finalize};
NP_EXPORT const ncclProfiler_v5_t ncclProfiler_v5 = {"ncclprobe", init_v5, start_v5, stop_event, record_state, finalize};
NP_EXPORT const ncclProfiler_v6_t ncclProfiler_v6 = {"ncclprobe", init_v6, start_v6, stop_event, record_state, finalize};
NP_EXPORT const ncclProfiler_v7_t ncclProfiler_v7 = {"ncclprobe", init_v7, start_v7, stop_event, record_state, finalize};
