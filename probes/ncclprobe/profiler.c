/* profiler.c - the NCCL profiler plugin role (NCCL_PROFILER_PLUGIN=<this library>).
 *
 * NCCL calls init once per communicator from comm init (v2.30.7-1 src/plugin/profiler.cc,
 * ncclProfilerPluginInit), and it tries ncclProfiler_v<newest> first, so exporting v4..v7 serves
 * NCCL 2.27 through 2.32 with the layout each one passes.
 *
 * What is counted, per communicator, per shape (func, algo, proto, channels, launch mode, size
 * bucket): collectives, bytes (sum, min, max) and, with GPU timing on, each collective's GPU time
 * in a histogram. A line per shape that moved is written every NCCLPROBE_FLUSH_S (default 5 s) by
 * a flusher thread, at finalize and at exit: a killed process loses at most the last interval.
 *
 * Launch mode (profiler v5+, NCCL 2.28+). NCCL starts a CollApi event for every collective call,
 * with graphCaptured, on the calling thread, inside the outermost GroupApi event; the collective
 * (Coll) event that carries algo/proto/channels has that CollApi handle as its parentObj - at
 * replay too, where it is the handle returned at capture (research-15 §2, §4). So the plugin
 * returns two sentinel handles per communicator for CollApi ("eager", "captured"), never freed
 * while the communicator lives, and reads a Coll's mode off its parent: eager; captured (the Coll
 * fires inside the capturing call: a graph without proxy ops, whose replays NCCL does not report);
 * replayed (a captured parent outside any API call on this thread: the graph's host callback).
 * v4 (NCCL 2.27) has no API events: the mode is unknown there.
 *
 * GPU timing (NCCLPROBE_GPU_TIMING=1, an explicit choice: NCCL then adds a proxy op to every
 * collective and a host callback to every captured graph, which costs time - benchmarks/
 * probe_profiler_cost.py measures the plugin's part): KernelCh events per channel carry
 * %globaltimer start (descriptor) and stop (recordEventState KernelChStop) in ns; a collective's
 * GPU time is the longest channel's, as NCCL's Inspector takes it. Those events come from NCCL's
 * proxy (or profiler) thread while the next collectives start on the caller's: every per-
 * collective slot is updated with atomics, in a fixed ring per communicator.
 *
 * Hot path (startEvent of a collective): a hash lookup of the shape, a few relaxed atomic adds, a
 * clock read (vDSO). No allocation, no lock (a new shape takes a short spin lock, at most
 * NP_SHAPES times per communicator), no I/O.
 *
 * Fork and exit: the registry lock is taken to add or remove a communicator, by the flusher and by
 * the exit flush, which only queue lines (writer.c writes them); every probe lock is taken around
 * fork() by writer.c's atfork handler, and the exit flush waits for it a bounded time, so a fork
 * child's exit() never waits forever. A fork child
 * never writes its parent's counts (pid check) and starts its own flusher with its first
 * communicator. The library is never unloaded (-z nodelete), so the flusher never outlives its
 * code. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "probe.h"

#define NP_SHAPES 256       /* distinct shapes per communicator; more are counted as dropped */
#define NP_HASH 1024        /* lookup table: pointer keys -> shape (several keys may name one shape) */
#define NP_HASH_FILL 768    /* keys at most (load under 3/4) */
#define NP_CHECK_EVERY 256  /* without a flusher thread: collectives between two clock reads */
#define NP_MAX_COMMS 4096   /* communicators flushed by the flusher and at exit; more still work, flushed at finalize */
/* GPU timing: collectives in flight per communicator (their KernelCh events not all stopped yet). NCCL's
 * own per-channel ring of GPU stamps holds 64 works (src/include/device.h): a proxy lagging further
 * reads overwritten stamps anyway; 1024 leaves a wide margin (about 1 MB per communicator). */
#define NP_SLOTS 1024
#define NP_MAXCH 64         /* GPU timing: channels per collective (NCCL's MAXCHANNELS) */
/* GPU time histogram: 8 bins per octave from 2^8 ns to 2^34 ns (256 ns .. 17 s; the edge bins take
 * what is below or above). A bin is 1/8 of its octave wide: its middle is within 6.25 % of any time
 * in it. ncclprobe/model/timing.py reads the same bins. */
#define NP_OCT_LO 8
#define NP_OCT_HI 33
#define NP_BINS ((NP_OCT_HI - NP_OCT_LO + 1) * 8)

enum { MODE_UNKNOWN = 0, MODE_EAGER, MODE_CAPTURED, MODE_REPLAYED };
static const char* const MODE_NAME[] = {NULL, "eager", "captured", "replayed"};

/* Every handle this plugin gives NCCL starts with its kind, so stopEvent and recordEventState can
 * tell them apart (NCCL passes back only handles we returned, or NULL). */
enum { H_NONE = 0, H_STATIC, H_GROUPAPI, H_API_EAGER, H_API_CAPTURED, H_SLOT, H_KCH };

struct tag {
  uint8_t kind;
};

struct shape {
  const char* func_p; /* the descriptor's pointers: NCCL passes string literals, so equality of */
  const char* algo_p; /* pointers is the fast match; equal text through other pointers matches */
  const char* proto_p;/* too (a second key for the same shape) */
  int nch, mode, sizeb;
  char func[24], algo[24], proto[16];
  /* written by the collective path (any thread), taken by the flusher with atomic exchanges */
  uint64_t count, bytes_sum, gpu_count, gpu_ns, untimed;
  uint64_t bmin, bmax; /* since the communicator's start (min/max merge the same either way) */
  uint32_t* hist;      /* NP_BINS bins, GPU timing only */
};

struct hent {
  const char* f;
  const char* a;
  const char* p;
  int nch, mode, sizeb;
  int idx; /* shape + 1; 0: empty. Published last (release), read first (acquire) */
};

struct kch { /* a KernelCh handle: one channel of one slot */
  uint8_t kind, ch;
  uint32_t gen;
  uint64_t start;
};

struct slot { /* a collective in flight, GPU timing only */
  uint8_t kind;
  uint8_t nch;
  int16_t shape;
  uint32_t gen;
  uint32_t done;   /* channels stopped */
  uint32_t closed; /* accounted (or given up) */
  uint64_t maxdur;
  struct pctx* c;
  struct kch ch[NP_MAXCH];
};

struct pctx {
  struct tag api_eager, api_captured, group_api; /* sentinel handles (see the top) */
  uint64_t comm_hash;
  pid_t pid; /* a fork child never flushes its parent's counts */
  int rank, nranks;
  int flushing; /* one flush at a time (flusher, finalize, exit) */
  int reg;      /* slot in g_reg, -1 if none */
  int timing;   /* GPU timing on for this communicator */
  uint32_t since_check;
  uint64_t last_flush_ns;
  uint64_t first_ns, last_ns; /* CLOCK_REALTIME of the first and the latest collective */
  uint64_t api_eager_n, api_captured_n; /* CollApi calls (eager, captured into a graph) */
  uint64_t flushes;
  int insert_lock;
  int nshapes, nkeys;
  uint64_t dropped;
  int dropped_reported;
  uint32_t next_slot;
  struct slot* slots; /* NP_SLOTS, GPU timing only */
  struct hent table[NP_HASH];
  struct shape shapes[NP_SHAPES];
};

static struct pctx* g_reg[NP_MAX_COMMS];
pthread_mutex_t np_reg_lock = PTHREAD_MUTEX_INITIALIZER; /* add/remove, flusher, exit */
static int g_mask_given; /* some communicator of this process got our mask */
static uint64_t g_flush_ns;
static int g_timing;     /* NCCLPROBE_GPU_TIMING=1 */
static pthread_once_t g_config_once = PTHREAD_ONCE_INIT;
static pid_t g_flusher_pid; /* the process whose flusher runs (0: none) */
static __thread int tl_in_api; /* inside an outermost GroupApi event on this thread */
static __thread const char* tl_dtype_p; /* the element size of the last datatype name seen */
static __thread uint64_t tl_dtype_size;
static struct tag g_group_handle = {H_STATIC}; /* v4's group handle (NCCL 2.27 needs one) */

static void read_config(void) { /* (not getenv: a host thread may race it, probe.h) */
  char s[64], t[4];
  ssize_t got = np_env_value("NCCLPROBE_FLUSH_S", s, sizeof s);
  char* end = NULL;
  double v = got > 0 && got < (ssize_t)sizeof s ? strtod(s, &end) : -1;
  if (got <= 0 || got >= (ssize_t)sizeof s || !end || *end || !(v >= 0) || v > 1e6) v = 5.0;
  g_flush_ns = (uint64_t)(v * 1e9);
  g_timing = np_env_value("NCCLPROBE_GPU_TIMING", t, sizeof t) == 1 && t[0] == '1';
}

static uint64_t wall_ns(void) { /* vDSO: tens of ns; the coarse clock's 4 ms would blur a short window */
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
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

static int bin_of(uint64_t ns) {
  if (ns < (1ull << NP_OCT_LO)) return 0;
  int oct = 63 - __builtin_clzll(ns);
  if (oct > NP_OCT_HI) return NP_BINS - 1;
  return (oct - NP_OCT_LO) * 8 + (int)((ns >> (oct - 3)) & 7);
}

static void copy_str(char* dst, size_t cap, const char* src) {
  if (!src) src = "";
  size_t n = strnlen(src, cap - 1);
  memcpy(dst, src, n);
  dst[n] = 0;
}

static int text_eq(const char* stored, const char* s) { return strcmp(stored, s ? s : "") == 0; }

static inline unsigned key_hash(const char* f, const char* a, const char* p, int nch, int mode, int sizeb) {
  uint64_t h = (uint64_t)(uintptr_t)f * 0x9e3779b97f4a7c15ull;
  h ^= (uint64_t)(uintptr_t)a * 0xc2b2ae3d27d4eb4full;
  h ^= (uint64_t)(uintptr_t)p * 0x165667b19e3779f9ull;
  h ^= ((uint64_t)nch << 16 | (uint64_t)mode << 8 | (uint64_t)(uint8_t)sizeb) * 0x27d4eb2f165667c5ull;
  return (unsigned)(h >> 40) & (NP_HASH - 1);
}

static int lock_insert(struct pctx* c) {
  /* Held for a few stores by a thread adding a shape. Bounded: a fork child whose parent's thread
   * held it must not spin forever. */
  for (long i = 0; i < (1L << 16); i++) {
    if (!__atomic_exchange_n(&c->insert_lock, 1, __ATOMIC_ACQUIRE)) return 1;
    if (i > 64) sched_yield();
  }
  return 0; /* counted as dropped */
}

static void unlock_insert(struct pctx* c) { __atomic_store_n(&c->insert_lock, 0, __ATOMIC_RELEASE); }

/* The shape of (func, algo, proto, nch, mode, sizeb), found or added; -1 when the table is full. */
static int find_shape(struct pctx* c, const char* func, const char* algo, const char* proto, int nch, int mode,
                      int sizeb) {
  unsigned h = key_hash(func, algo, proto, nch, mode, sizeb);
  for (unsigned i = 0; i < NP_HASH; i++) {
    struct hent* e = &c->table[(h + i) & (NP_HASH - 1)];
    int idx = __atomic_load_n(&e->idx, __ATOMIC_ACQUIRE);
    if (!idx) break;
    if (e->f == func && e->a == algo && e->p == proto && e->nch == nch && e->mode == mode && e->sizeb == sizeb)
      return idx - 1;
  }
  /* A new key: under the insert lock, the same text through other pointers is the same shape. */
  if (!lock_insert(c)) return -1;
  int found = -1;
  unsigned at = h;
  for (unsigned i = 0; i < NP_HASH; i++, at = (at + 1) & (NP_HASH - 1)) {
    struct hent* e = &c->table[at];
    int idx = __atomic_load_n(&e->idx, __ATOMIC_ACQUIRE);
    if (!idx) break;
    if (e->f == func && e->a == algo && e->p == proto && e->nch == nch && e->mode == mode && e->sizeb == sizeb) {
      found = idx - 1; /* another thread added it meanwhile */
      goto out;
    }
  }
  for (int i = 0; i < c->nshapes; i++) {
    struct shape* s = &c->shapes[i];
    if (s->nch == nch && s->mode == mode && s->sizeb == sizeb && text_eq(s->func, func) && text_eq(s->algo, algo) &&
        text_eq(s->proto, proto)) {
      found = i;
      break;
    }
  }
  if (found < 0) {
    if (c->nshapes == NP_SHAPES) goto out;
    struct shape* s = &c->shapes[c->nshapes];
    s->func_p = func;
    s->algo_p = algo;
    s->proto_p = proto;
    s->nch = nch;
    s->mode = mode;
    s->sizeb = sizeb;
    copy_str(s->func, sizeof s->func, func);
    copy_str(s->algo, sizeof s->algo, algo);
    copy_str(s->proto, sizeof s->proto, proto);
    __atomic_store_n(&s->bmin, UINT64_MAX, __ATOMIC_RELAXED);
    found = c->nshapes;
    __atomic_store_n(&c->nshapes, c->nshapes + 1, __ATOMIC_RELEASE); /* the flusher reads up to here */
  }
  if (c->nkeys < NP_HASH_FILL) { /* else found by the text scan above, more slowly */
    struct hent* e = &c->table[at];
    e->f = func;
    e->a = algo;
    e->p = proto;
    e->nch = nch;
    e->mode = mode;
    e->sizeb = sizeb;
    __atomic_store_n(&e->idx, found + 1, __ATOMIC_RELEASE);
    c->nkeys++;
  }
out:
  unlock_insert(c);
  return found;
}

static void flush(struct pctx* c, const char* reason);

static void atomic_min(uint64_t* p, uint64_t v) {
  uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v < cur && !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

static void atomic_max(uint64_t* p, uint64_t v) {
  uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v > cur && !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

/* A slot given up before all its channels stopped: its collective counts as untimed. */
static void close_slot(struct slot* s, int timed) {
  if (__atomic_exchange_n(&s->closed, 1, __ATOMIC_ACQ_REL)) return;
  if (s->shape < 0) return;
  struct shape* sh = &s->c->shapes[s->shape];
  if (!timed) {
    __atomic_fetch_add(&sh->untimed, 1, __ATOMIC_RELAXED);
    return;
  }
  uint64_t d = __atomic_load_n(&s->maxdur, __ATOMIC_RELAXED);
  __atomic_fetch_add(&sh->gpu_count, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&sh->gpu_ns, d, __ATOMIC_RELAXED);
  if (sh->hist) __atomic_fetch_add(&sh->hist[bin_of(d)], 1, __ATOMIC_RELAXED);
}

/* The collective path: returns the handle for the Coll event (a slot with GPU timing on, else NULL). */
static inline void* record(struct pctx* c, const char* func, const char* algo, const char* proto, int nch, size_t count,
                           const char* dtype, int mode) {
  if (tl_dtype_p != dtype) { /* per thread: NCCL's events come from several */
    tl_dtype_p = dtype;
    tl_dtype_size = elem_size(dtype);
  }
  uint64_t bytes = (uint64_t)count * tl_dtype_size;
  int sizeb = bytes ? 63 - __builtin_clzll(bytes) : -1;
  int i = find_shape(c, func, algo, proto, nch, mode, sizeb);
  void* handle = NULL;
  if (i < 0) {
    __atomic_fetch_add(&c->dropped, 1, __ATOMIC_RELAXED);
  } else {
    struct shape* s = &c->shapes[i];
    __atomic_fetch_add(&s->count, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->bytes_sum, bytes, __ATOMIC_RELAXED);
    if (bytes < __atomic_load_n(&s->bmin, __ATOMIC_RELAXED)) atomic_min(&s->bmin, bytes);
    if (bytes > __atomic_load_n(&s->bmax, __ATOMIC_RELAXED)) atomic_max(&s->bmax, bytes);
    if (c->slots) {
      struct slot* sl = &c->slots[__atomic_fetch_add(&c->next_slot, 1, __ATOMIC_RELAXED) % NP_SLOTS];
      /* Still open: its channels never all stopped within NP_SLOTS collectives (proxy lag, or a
       * kernel without KernelCh events): untimed, and the slot is reused. */
      if (sl->kind == H_SLOT) close_slot(sl, 0);
      sl->kind = H_SLOT;
      sl->c = c;
      sl->shape = (int16_t)i;
      sl->nch = (uint8_t)(nch > 0 && nch <= NP_MAXCH ? nch : 0);
      __atomic_store_n(&sl->maxdur, 0, __ATOMIC_RELAXED);
      __atomic_store_n(&sl->done, 0, __ATOMIC_RELAXED);
      __atomic_fetch_add(&sl->gen, 1, __ATOMIC_RELAXED);
      __atomic_store_n(&sl->closed, sl->nch ? 0 : 1, __ATOMIC_RELEASE);
      if (!sl->nch) __atomic_fetch_add(&s->untimed, 1, __ATOMIC_RELAXED);
      handle = sl;
    }
  }
  uint64_t now = wall_ns();
  if (!__atomic_load_n(&c->first_ns, __ATOMIC_RELAXED)) {
    uint64_t zero = 0;
    __atomic_compare_exchange_n(&c->first_ns, &zero, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  }
  __atomic_store_n(&c->last_ns, now, __ATOMIC_RELAXED);
  if (__atomic_load_n(&g_flusher_pid, __ATOMIC_RELAXED) != c->pid && ++c->since_check >= NP_CHECK_EVERY) {
    /* no flusher thread in this process: the collectives drive the periodic flush */
    c->since_check = 0;
    if (np_now_ns() - c->last_flush_ns >= g_flush_ns) flush(c, "periodic");
  }
  return handle;
}

static void kernel_ch_start(struct slot* sl, void** eHandle, uint8_t ch, uint64_t ptimer) {
  if (!sl || sl->kind != H_SLOT || ch >= NP_MAXCH) return;
  struct kch* k = &sl->ch[ch];
  k->kind = H_KCH;
  k->ch = ch;
  k->gen = __atomic_load_n(&sl->gen, __ATOMIC_ACQUIRE);
  k->start = ptimer;
  *eHandle = k;
}

static void kernel_ch_stop(struct kch* k, uint64_t ptimer) {
  struct slot* sl = (struct slot*)((char*)(k - k->ch) - offsetof(struct slot, ch));
  if (k->gen != __atomic_load_n(&sl->gen, __ATOMIC_ACQUIRE)) return; /* the slot went to a later collective */
  if (ptimer > k->start && k->start) atomic_max(&sl->maxdur, ptimer - k->start);
  if (__atomic_add_fetch(&sl->done, 1, __ATOMIC_ACQ_REL) == sl->nch)
    close_slot(sl, __atomic_load_n(&sl->maxdur, __ATOMIC_RELAXED) > 0);
}

static void jb_nullable(np_jb* jb, const char* key, const char* s) {
  if (s && s[0]) np_jb_str(jb, key, s);
  else np_jb_null(jb, key);
}

static void jb_time(np_jb* jb, const char* key, uint64_t ns) {
  if (ns) np_jb_dbl(jb, key, ns / 1e9, 6);
  else np_jb_null(jb, key);
}

/* The histogram's bins that moved, as [[bin, n], ...]; taken (exchanged with 0) as they are written. */
static void jb_hist(np_jb* jb, uint32_t* hist) {
  size_t mark = jb->len;
  np_jb_key(jb, "gpu_hist");
  np_jb_raw(jb, "[", 1);
  int first = 1;
  for (int b = 0; b < NP_BINS; b++) {
    if (!__atomic_load_n(&hist[b], __ATOMIC_RELAXED)) continue;
    uint32_t n = __atomic_exchange_n(&hist[b], 0, __ATOMIC_RELAXED);
    char item[32];
    int len = snprintf(item, sizeof item, "%s[%d,%u]", first ? "" : ",", b, n);
    np_jb_raw(jb, item, (size_t)len);
    first = 0;
  }
  np_jb_raw(jb, "]", 1);
  np_jb_settle(jb, mark);
}

/* Queues the lines of a communicator's counts that moved. Never waits for the writer (writer.c):
 * it runs on the collective path (NP_CHECK_EVERY), in the flusher under the registry lock that
 * fork() takes, and at exit; finalize waits once, for all of them, after it. */
static void flush(struct pctx* c, const char* reason) {
  if (__atomic_exchange_n(&c->flushing, 1, __ATOMIC_ACQUIRE)) return;
  c->last_flush_ns = np_now_ns();
  np_tl_nowait++;
  if (c->pid == getpid() && np_log_active()) {
    int n = __atomic_load_n(&c->nshapes, __ATOMIC_ACQUIRE), moved = 0;
    for (int i = 0; i < n; i++) {
      struct shape* s = &c->shapes[i];
      if (!__atomic_load_n(&s->count, __ATOMIC_RELAXED) && !__atomic_load_n(&s->gpu_count, __ATOMIC_RELAXED) &&
          !__atomic_load_n(&s->untimed, __ATOMIC_RELAXED))
        continue;
      moved = 1;
      char buf[4096];
      np_jb jb;
      np_jb_init(&jb, buf, sizeof buf);
      np_event_begin(&jb, "coll_summary", "profiler");
      np_jb_id(&jb, "comm_hash", c->comm_hash);
      np_jb_int(&jb, "rank", c->rank);
      jb_nullable(&jb, "func", s->func);
      jb_nullable(&jb, "algo", s->algo);
      jb_nullable(&jb, "proto", s->proto);
      np_jb_int(&jb, "nchannels", s->nch);
      jb_nullable(&jb, "mode", MODE_NAME[s->mode]);
      if (s->sizeb >= 0) np_jb_int(&jb, "size_log2", s->sizeb);
      else np_jb_null(&jb, "size_log2");
      np_jb_uint(&jb, "bytes_min", __atomic_load_n(&s->bmin, __ATOMIC_RELAXED));
      np_jb_uint(&jb, "bytes_max", __atomic_load_n(&s->bmax, __ATOMIC_RELAXED));
      np_jb_uint(&jb, "count", __atomic_exchange_n(&s->count, 0, __ATOMIC_RELAXED));
      np_jb_uint(&jb, "bytes_sum", __atomic_exchange_n(&s->bytes_sum, 0, __ATOMIC_RELAXED));
      if (c->timing) {
        np_jb_uint(&jb, "gpu_count", __atomic_exchange_n(&s->gpu_count, 0, __ATOMIC_RELAXED));
        np_jb_uint(&jb, "gpu_ns", __atomic_exchange_n(&s->gpu_ns, 0, __ATOMIC_RELAXED));
        np_jb_uint(&jb, "untimed", __atomic_exchange_n(&s->untimed, 0, __ATOMIC_RELAXED));
        if (s->hist) jb_hist(&jb, s->hist);
      }
      np_jb_str(&jb, "reason", reason);
      np_event_end(&jb);
    }
    uint64_t eager = __atomic_exchange_n(&c->api_eager_n, 0, __ATOMIC_RELAXED);
    uint64_t captured = __atomic_exchange_n(&c->api_captured_n, 0, __ATOMIC_RELAXED);
    /* The communicator's activity: when its collectives ran, and whether this is its last word.
     * Written with every flush that moved, and always at finalize and exit. */
    if (moved || eager || captured || strcmp(reason, "periodic") != 0) {
      char buf[1024];
      np_jb jb;
      np_jb_init(&jb, buf, sizeof buf);
      np_event_begin(&jb, "comm_activity", "profiler");
      np_jb_id(&jb, "comm_hash", c->comm_hash);
      np_jb_int(&jb, "rank", c->rank);
      np_jb_int(&jb, "nranks", c->nranks);
      jb_time(&jb, "first_t", __atomic_load_n(&c->first_ns, __ATOMIC_RELAXED));
      jb_time(&jb, "last_t", __atomic_load_n(&c->last_ns, __ATOMIC_RELAXED));
      np_jb_uint(&jb, "api_eager", eager);
      np_jb_uint(&jb, "api_captured", captured);
      np_jb_str(&jb, "timing", c->timing ? "gpu" : "off");
      np_jb_dbl(&jb, "flush_s", g_flush_ns / 1e9, 3);
      np_jb_uint(&jb, "flush", ++c->flushes);
      np_jb_str(&jb, "reason", reason);
      np_event_end(&jb);
    }
    uint64_t dropped = __atomic_load_n(&c->dropped, __ATOMIC_RELAXED);
    if (dropped && !c->dropped_reported) {
      char msg[200], id[NP_ID_CHARS];
      np_id_text(id, c->comm_hash);
      snprintf(msg, sizeof msg, "comm %s: more than %d collective shapes; %llu collectives not summarized", id,
               NP_SHAPES, (unsigned long long)dropped);
      np_probe_error("profiler", "coll_summary", &c->dropped_reported, msg);
    }
  }
  np_tl_nowait--;
  __atomic_store_n(&c->flushing, 0, __ATOMIC_RELEASE);
}

/* The flusher: every NCCLPROBE_FLUSH_S, the communicators whose counts moved. Signals blocked (they
 * are the host's); it only ever waits on the registry lock, and only queues lines (the registry
 * lock, which fork() takes, is never held across a write). */
static void* flusher_main(void* arg) {
  pid_t me = (pid_t)(intptr_t)arg;
  np_tl_nowait = 1;
  struct timespec ts = {(time_t)(g_flush_ns / 1000000000ull), (long)(g_flush_ns % 1000000000ull)};
  for (;;) {
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    ts.tv_sec = (time_t)(g_flush_ns / 1000000000ull);
    ts.tv_nsec = (long)(g_flush_ns % 1000000000ull);
    if (getpid() != me) return NULL; /* cannot happen (a fork child has no copy of this thread) */
    pthread_mutex_lock(&np_reg_lock);
    for (int i = 0; i < NP_MAX_COMMS; i++)
      if (g_reg[i]) flush(g_reg[i], "periodic");
    pthread_mutex_unlock(&np_reg_lock);
  }
  return NULL;
}

/* Called with np_reg_lock held. A failure leaves the collectives to drive the flush. */
static void start_flusher(void) {
  pid_t me = getpid();
  if (g_flusher_pid == me || g_flush_ns == 0) return;
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0) return;
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 64 * 1024);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* the new thread inherits the blocked set */
  pthread_t t;
  int saved = errno;
  if (pthread_create(&t, &attr, flusher_main, (void*)(intptr_t)me) == 0) {
    __atomic_store_n(&g_flusher_pid, me, __ATOMIC_RELAXED);
    pthread_setname_np(t, "ncclprobe-flush");
  }
  errno = saved;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
}

/* Counts still in memory when the process exits without destroying its communicators (common:
 * PyTorch programs that skip destroy_process_group). */
__attribute__((destructor)) static void flush_at_exit(void) {
  int saved = errno;
  /* The lock is never held for long (add/remove, a flush), and fork() cannot leave it held in a
   * child (atfork, log.c). Still, a child made by a raw clone() runs no atfork handler: after one
   * second the exit flush is given up rather than the exit. */
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
  errno = saved; /* writer.c's exit destructor then waits (bounded) for the queued lines */
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
     * for ours: clearing the global mask would stop its collection too. This one's events come
     * with a NULL context and are ignored. */
    if (!__atomic_load_n(&g_mask_given, __ATOMIC_RELAXED)) *mask = 0;
    return ncclSuccess;
  }
  pthread_once(&g_config_once, read_config);
  /* Collectives (NCCL then also starts the API events, which give the launch mode), and the
   * kernels' channels where GPU timing was asked for; whatever was there before. */
  *mask = ncclProfileColl | (g_timing ? ncclProfileKernelCh : 0);
  __atomic_store_n(&g_mask_given, 1, __ATOMIC_RELAXED);
  np_lib* lib = np_lib_of(caller);
  plugin_load(lib, plugin);

  char buf[NP_LINE_MAX];
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
  np_jb_str(&jb, "timing", g_timing ? "gpu" : "off");
  if (lib && lib->version) np_jb_int(&jb, "version", lib->version);
  else np_jb_null(&jb, "version");
  np_jb_bool(&jb, "simulated", lib && lib->simulated);
  np_jb_env(&jb); /* as NCCL has it now: includes values NCCL set from nccl.conf files */
  np_event_end(&jb);

  /* Allocation at init is fine (once per communicator); nothing allocates per collective. */
  struct pctx* c = (struct pctx*)calloc(1, sizeof *c);
  if (!c) return ncclSuccess; /* NULL context: events are ignored */
  c->api_eager.kind = H_API_EAGER;
  c->api_captured.kind = H_API_CAPTURED;
  c->group_api.kind = H_GROUPAPI;
  c->comm_hash = commHash;
  c->pid = getpid();
  c->rank = rank;
  c->nranks = nranks;
  c->last_flush_ns = np_now_ns();
  c->reg = -1;
  if (g_timing) {
    c->slots = (struct slot*)calloc(NP_SLOTS, sizeof *c->slots);
    uint32_t* hist = (uint32_t*)calloc((size_t)NP_SHAPES * NP_BINS, sizeof *hist);
    if (c->slots && hist) {
      for (int i = 0; i < NP_SHAPES; i++) c->shapes[i].hist = hist + (size_t)i * NP_BINS;
      c->timing = 1;
    } else {
      free(c->slots);
      free(hist);
      c->slots = NULL;
    }
  }
  pthread_mutex_lock(&np_reg_lock);
  for (int i = 0; i < NP_MAX_COMMS; i++) {
    if (!g_reg[i]) {
      g_reg[i] = c;
      c->reg = i;
      break;
    }
  }
  start_flusher();
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
  /* Out of the registry under the lock (neither the flusher nor the exit flush can reach it once
   * we hold it and take it out), then the lines are written without any lock held. */
  pthread_mutex_lock(&np_reg_lock);
  if (c->reg >= 0) g_reg[c->reg] = NULL;
  pthread_mutex_unlock(&np_reg_lock);
  if (c->slots) /* collectives still in flight: their last channels will not be seen now */
    for (int i = 0; i < NP_SLOTS; i++)
      if (c->slots[i].kind == H_SLOT) close_slot(&c->slots[i], 0);
  flush(c, "finalize");
  if (c->pid == getpid() && np_log_enabled()) {
    char buf[512];
    np_jb jb;
    np_jb_init(&jb, buf, sizeof buf);
    np_event_begin(&jb, "comm_plugin_finalize", "profiler");
    np_jb_id(&jb, "comm_hash", c->comm_hash);
    np_event_end(&jb);
  }
  /* NCCL finalizes a communicator after its work is done: no event for it is in flight. */
  free(c->slots);
  free(c->shapes[0].hist);
  free(c);
  return ncclSuccess;
}

static ncclResult_t finalize(void* context) {
  int saved = errno;
  ncclResult_t rc = finalize_impl(context);
  errno = saved;
  return rc;
}

/* NCCL calls stopEvent only for a non-NULL handle we returned (research-15 §2; the net-plugin path
 * may pass NULL). */
static ncclResult_t stop_event(void* handle) {
  if (handle && ((struct tag*)handle)->kind == H_GROUPAPI) tl_in_api = 0;
  return ncclSuccess;
}

static ncclResult_t record_state(void* handle, ncclProfilerEventState_t state, ncclProfilerEventStateArgs_v4_t* args) {
  if (handle && args && state == ncclProfilerKernelChStop && ((struct tag*)handle)->kind == H_KCH)
    kernel_ch_stop((struct kch*)handle, args->kernelCh.pTimer);
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
static ncclResult_t start_v4(void* context, void** eHandle, ncclProfilerEventDescr_v4_t* d) {
  *eHandle = NULL;
  struct pctx* c = (struct pctx*)context;
  if (!c) return ncclSuccess;
  if (d->type == ncclProfileGroup) *eHandle = &g_group_handle;
  else if (d->type == ncclProfileColl)
    *eHandle = record(c, d->coll.func, d->coll.algo, d->coll.proto, d->coll.nChannels, d->coll.count, d->coll.datatype,
                      MODE_UNKNOWN);
  else if (d->type == ncclProfileKernelCh)
    kernel_ch_start((struct slot*)d->parentObj, eHandle, d->kernelCh.channelId, d->kernelCh.pTimer);
  return ncclSuccess;
}

/* The mode of a Coll event from its parent (the CollApi handle, see the top). */
static inline int mode_of(struct pctx* c, const void* parent) {
  if (parent == &c->api_eager) return MODE_EAGER;
  if (parent == &c->api_captured) return tl_in_api ? MODE_CAPTURED : MODE_REPLAYED;
  return MODE_UNKNOWN;
}

/* ---- v5, v6, v7 (NCCL 2.28 / 2.29-2.30 / 2.31+): uint64_t type; init(ctx, commId, mask, ...).
 * type, parentObj and the members used here are laid out identically in all three (nccl_abi.h
 * asserts the coll ones). */
#define NP_PROFILER_VERSION(V)                                                                           \
  static ncclResult_t init_##V(void** context, uint64_t commId, int* mask, const char* commName,          \
                               int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {               \
    return init_common(context, mask, commName, commId, nNodes, nranks, rank, "ncclProfiler_" #V, CALLER); \
  }                                                                                                      \
  static ncclResult_t start_##V(void* context, void** eHandle, ncclProfilerEventDescr_##V##_t* d) {      \
    *eHandle = NULL;                                                                                     \
    struct pctx* c = (struct pctx*)context;                                                              \
    if (!c) return ncclSuccess;                                                                          \
    switch (d->type) {                                                                                   \
      case ncclProfileColl:                                                                              \
        *eHandle = record(c, d->coll.func, d->coll.algo, d->coll.proto, d->coll.nChannels, d->coll.count, \
                          d->coll.datatype, mode_of(c, d->parentObj));                                   \
        break;                                                                                           \
      case ncclProfileCollApi:                                                                           \
        if (d->collApi.graphCaptured) {                                                                  \
          __atomic_fetch_add(&c->api_captured_n, 1, __ATOMIC_RELAXED);                                   \
          *eHandle = &c->api_captured;                                                                   \
        } else {                                                                                         \
          __atomic_fetch_add(&c->api_eager_n, 1, __ATOMIC_RELAXED);                                      \
          *eHandle = &c->api_eager;                                                                      \
        }                                                                                                \
        break;                                                                                           \
      case ncclProfileGroupApi:                                                                          \
        tl_in_api = 1;                                                                                   \
        *eHandle = &c->group_api;                                                                        \
        break;                                                                                           \
      case ncclProfileKernelCh:                                                                          \
        kernel_ch_start((struct slot*)d->parentObj, eHandle, d->kernelCh.channelId, d->kernelCh.pTimer); \
        break;                                                                                           \
      default:                                                                                           \
        break;                                                                                           \
    }                                                                                                    \
    return ncclSuccess;                                                                                  \
  }
NP_PROFILER_VERSION(v5)
NP_PROFILER_VERSION(v6)
NP_PROFILER_VERSION(v7)
#undef NP_PROFILER_VERSION

NP_EXPORT const ncclProfiler_v4_t ncclProfiler_v4 = {"ncclprobe", init_v4, start_v4, stop_event, record_state, finalize};
NP_EXPORT const ncclProfiler_v5_t ncclProfiler_v5 = {"ncclprobe", init_v5, start_v5, stop_event, record_state, finalize};
NP_EXPORT const ncclProfiler_v6_t ncclProfiler_v6 = {"ncclprobe", init_v6, start_v6, stop_event, record_state, finalize};
NP_EXPORT const ncclProfiler_v7_t ncclProfiler_v7 = {"ncclprobe", init_v7, start_v7, stop_event, record_state, finalize};
