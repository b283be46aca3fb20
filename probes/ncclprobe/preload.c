/* preload.c - LD_PRELOAD interposers for every communicator-creation entry point NCCL exports and
 * for ncclCommFinalize/Destroy/Abort.
 *
 * NCCL_API defines each API function weak with a strong p<func> alias and every public init funnels
 * into a static ncclCommInitRankDev (split/shrink/grow into ncclCommInitRankFunc), so each entry
 * point is hooked separately (v2.30.7-1 src/include/core.h, src/init.cc). The hook never changes
 * arguments, results or return codes; it records what the caller asked for, the watched
 * environment in force at the call, and what came back (events.py: comm_init, comm_destroy). */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "probe.h"

__thread uint64_t np_tl_call;
static __thread int tl_depth; /* hook frames on this thread: >0 while it runs a real call we hooked */
static uint64_t g_next_call;

enum {
  API_INIT_RANK, API_INIT_RANK_CONFIG, API_INIT_ALL, API_INIT_SCALABLE, API_SPLIT, API_SHRINK, API_GROW,
  API_FINALIZE, API_DESTROY, API_ABORT, API_N
};
static const char* const api_name[API_N] = {
    "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitAll", "ncclCommInitRankScalable",
    "ncclCommSplit",    "ncclCommShrink",         "ncclCommGrow",    "ncclCommFinalize",
    "ncclCommDestroy",  "ncclCommAbort"};

/* ---------------------------------------------------------------- finding the real function */

#define NP_RESOLVE_CACHE 64
struct resolved {
  void* caller_base; /* the object the call came from */
  int api;
  void* fn;
};
static struct resolved g_cache[NP_RESOLVE_CACHE];
static int g_ncache;
pthread_mutex_t np_cache_lock = PTHREAD_MUTEX_INITIALIZER;

/* The object defining `name` itself (not through a dependency), given one of its addresses. */
static void* own_sym(const char* fname, void* fbase, const char* name) {
  if (!fname || !fname[0]) return NULL;
  void* h = dlopen(fname, RTLD_NOLOAD | RTLD_LAZY);
  if (!h) return NULL;
  void* p = dlsym(h, name);
  Dl_info di;
  if (p && (!dladdr(p, &di) || di.dli_fbase != fbase)) p = NULL;
  dlclose(h); /* the object stays mapped: it was loaded before we looked */
  return p;
}

/* p lies in a copy of the probe: this one, or another install of it (a second path, or loaded by
 * NCCL as a plugin under another name), known by its own ncclprobe_version. Calling into one
 * would come back here. */
static int in_probe(const void* p) {
  Dl_info info;
  if (!p || !dladdr(p, &info) || !info.dli_fbase) return 0;
  if (info.dli_fbase == np_self_base()) return 1;
  return own_sym(info.dli_fname, info.dli_fbase, "ncclprobe_version") != NULL;
}

/* NCCL's own file names: libnccl.so and libnccl.so.<version>. Not libncclprobe.so, nor NCCL's
 * plugins (libnccl-net.so, libnccl-profiler-*.so, libnccl-tuner-*.so, libnccl-env-*.so). */
static int nccl_file_name(const char* path) {
  const char* slash = strrchr(path, '/');
  const char* base = slash ? slash + 1 : path;
  return strcmp(base, "libnccl.so") == 0 || strncmp(base, "libnccl.so.", 11) == 0;
}

struct phdr_search {
  const char* name;
  void* fn;
};

/* A loaded libnccl.so[.*] that itself defines the symbol, and is no copy of the probe. */
static int phdr_visit(struct dl_phdr_info* info, size_t size, void* data) {
  struct phdr_search* s = (struct phdr_search*)data;
  const char* path = info->dlpi_name;
  if (!path || !path[0] || !nccl_file_name(path)) return 0;
  void* h = dlopen(path, RTLD_NOLOAD | RTLD_LAZY);
  if (!h) return 0;
  void* p = dlsym(h, s->name);
  Dl_info di;
  /* dlsym(handle) also searches the library's dependencies: insist on its own definition. */
  if (p && dladdr(p, &di) && di.dli_fname && strcmp(di.dli_fname, path) == 0 && !in_probe(p)) s->fn = p;
  dlclose(h); /* the library stays mapped: it was loaded before we looked */
  return s->fn != NULL;
}

/* The function the caller would have reached without us. In order:
 *  1. the caller's own dependency scope: dlsym on the caller's handle searches exactly the
 *     objects it was linked against, so a caller in a local scope (libtorch_cuda under PyTorch)
 *     reaches the libnccl copy it links, even when another copy is loaded. That search starts
 *     with the caller itself: a definition there is taken only if the caller really is NCCL
 *     (defines ncclGetVersion itself, e.g. a static NCCL calling its own API). Otherwise the
 *     caller is another interposer that forwarded to us with dlsym(RTLD_NEXT): its own
 *     definition would send the call back to it, and round again;
 *  2. dlsym(RTLD_NEXT): the global scope after us (a program linked against libnccl);
 *  3. any loaded libnccl.so[.*] that defines it: dlsym(RTLD_NEXT) returns NULL when libnccl sits
 *     in a local scope (observed with torch 2.11 + NCCL 2.28.9, reference/observed.md).
 * A candidate inside any copy of the probe is never taken: calling it would recurse. */
static void* resolve(int api, const void* caller) {
  Dl_info ci;
  void* cbase = (caller && dladdr(caller, &ci)) ? ci.dli_fbase : NULL;
  int n = __atomic_load_n(&g_ncache, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (g_cache[i].caller_base == cbase && g_cache[i].api == api) return g_cache[i].fn;

  const char* name = api_name[api];
  void* fn = NULL;
  if (cbase && cbase != np_self_base() && ci.dli_fname && ci.dli_fname[0]) {
    void* h = dlopen(ci.dli_fname, RTLD_NOLOAD | RTLD_LAZY);
    if (h) {
      void* p = dlsym(h, name);
      Dl_info pi;
      int in_caller = p && dladdr(p, &pi) && pi.dli_fbase == cbase;
      if (p && !in_probe(p) && (!in_caller || own_sym(ci.dli_fname, cbase, "ncclGetVersion"))) fn = p;
      dlclose(h);
    }
  }
  if (!fn) {
    void* p = dlsym(RTLD_NEXT, name);
    if (p && !in_probe(p)) fn = p;
  }
  if (!fn) {
    struct phdr_search s = {name, NULL};
    dl_iterate_phdr(phdr_visit, &s);
    fn = s.fn;
  }
  if (fn) {
    /* Keep the defining library referenced so that a dlclose by the host cannot unmap it under
     * the cached pointer (np_lib_of holds a NOLOAD handle). */
    np_lib_of(fn);
    pthread_mutex_lock(&np_cache_lock);
    if (g_ncache < NP_RESOLVE_CACHE) {
      g_cache[g_ncache] = (struct resolved){cbase, api, fn};
      __atomic_store_n(&g_ncache, g_ncache + 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&np_cache_lock);
  }
  return fn;
}

static int g_missing_once[API_N];

static void report_missing(int api) {
  char msg[160];
  snprintf(msg, sizeof msg, "no loaded libnccl defines %s; the call returns ncclInternalError", api_name[api]);
  np_probe_error("preload", api_name[api], &g_missing_once[api], msg);
}

/* Hook frames this thread may stack: a real call reaching our hook again (NCCL calling its own
 * API) is one or two deep; more means a cycle between us and something that forwards back to us
 * (another interposer or probe copy that resolution did not recognize). */
#define NP_MAX_NEST 8
static int g_cycle_once;

static void report_cycle(int api) {
  char msg[200];
  snprintf(msg, sizeof msg, "%s re-entered the hook %d times on one thread (a forwarding cycle); the call "
           "returns ncclInternalError", api_name[api], NP_MAX_NEST);
  np_probe_error("preload", api_name[api], &g_cycle_once, msg);
}

/* ---------------------------------------------------------------- event pieces */

static void jb_uid(np_jb* jb, const ncclUniqueId* ids, int n) {
  if (!ids || n <= 0) {
    np_jb_null(jb, "uid");
    return;
  }
  uint64_t h = NP_FNV_OFFSET;
  for (int i = 0; i < n; i++) h = np_fnv1a(ids[i].internal, sizeof ids[i].internal, h);
  np_jb_id(jb, "uid", h);
}

/* The caller's ncclConfig_t, read the way parseCommConfig does (v2.30.7-1 src/init.cc): `size`
 * first, never past it nor past the newest layout we know; magic must be NCCL_API_MAGIC; a field
 * counts only if the caller's `version` has it. Fields left at NCCL_CONFIG_UNDEF are omitted:
 * the object holds what the caller set. NCCL reads the same bytes right after us. */
static void jb_config(np_jb* jb, const ncclConfig_t* cfg) {
  if (!cfg) {
    np_jb_null(jb, "config");
    return;
  }
  size_t size, mark = jb->len;
  memcpy(&size, cfg, sizeof size);
  np_jb_key(jb, "config");
  np_jb_raw(jb, "{", 1);
  np_jb_uint(jb, "size", size);
  if (size < offsetof(ncclConfig_t, blocking)) {
    np_jb_bool(jb, "valid", 0);
  } else if (cfg->magic != NCCL_API_MAGIC) {
    np_jb_hex(jb, "magic", cfg->magic);
    np_jb_bool(jb, "valid", 0);
  } else {
    size_t limit = size < sizeof(ncclConfig_t) ? size : sizeof(ncclConfig_t);
    unsigned version = cfg->version;
    np_jb_uint(jb, "version", version);
    np_jb_bool(jb, "valid", 1);
#define NP_CFG_INT(field)                                  \
  if (cfg->field != NCCL_CONFIG_UNDEF_INT) np_jb_int(jb, #field, cfg->field);
#define NP_CFG_STR(field)                                  \
  if (cfg->field) np_jb_str(jb, #field, cfg->field);
#define NP_CFG_FIELD(field, kind, since)                                                       \
  if (offsetof(ncclConfig_t, field) + sizeof(cfg->field) <= limit && version >= (unsigned)(since)) { \
    NP_CFG_##kind(field)                                                                       \
  }
    NCCL_ABI_CONFIG_FIELDS(NP_CFG_FIELD)
#undef NP_CFG_FIELD
#undef NP_CFG_INT
#undef NP_CFG_STR
  }
  np_jb_raw(jb, "}", 1);
  np_jb_settle(jb, mark);
}

static void jb_int_array(np_jb* jb, const char* key, const int* v, int n) {
  if (!v || n < 0) {
    np_jb_null(jb, key);
    return;
  }
  size_t mark = jb->len;
  np_jb_key(jb, key);
  np_jb_raw(jb, "[", 1);
  if (n > 64) jb->truncated = 1; /* at most 64 entries of a device list, a rank list */
  for (int i = 0; i < n && i < 64; i++) {
    char t[16];
    int l = snprintf(t, sizeof t, i ? ",%d" : "%d", v[i]);
    if (l > 0 && (size_t)l < sizeof t) np_jb_raw(jb, t, (size_t)l);
  }
  np_jb_raw(jb, "]", 1);
  np_jb_settle(jb, mark);
}

/* State carried from before the real call to after it. */
struct hook {
  int api;
  int logging;
  uint64_t call;
  uint64_t t0;
  np_jb jb;
  size_t prefix; /* length of the part shared by all communicators of one call (InitAll) */
  int prefix_truncated;
  int err; /* errno: the caller's until the real call, then the real call's */
};

/* The hook's own work (the log's first open, its writes, dlsym) must not show in errno. */
static ncclResult_t hook_return(struct hook* h, ncclResult_t rc) {
  errno = h->err;
  return rc;
}

static void hook_begin(struct hook* h, char* buf, size_t cap, int api) {
  h->err = errno;
  h->api = api;
  h->logging = np_log_enabled();
  h->call = __atomic_add_fetch(&g_next_call, 1, __ATOMIC_RELAXED);
  np_jb_init(&h->jb, buf, cap);
  if (h->logging) {
    np_event_begin(&h->jb, api >= API_FINALIZE ? "comm_destroy" : "comm_init", "preload");
    np_jb_str(&h->jb, "api", api_name[api]);
    np_jb_uint(&h->jb, "call", h->call);
  }
}

/* Called right before the real function: the environment is taken now, as NCCL will see it. */
static void hook_enter(struct hook* h) {
  if (h->logging && h->api < API_FINALIZE) np_jb_env(&h->jb);
  h->prefix = h->jb.len;
  tl_depth++;
  np_tl_call = h->call;
  h->t0 = np_now_ns();
  errno = h->err;
}

static void hook_leave(struct hook* h, ncclResult_t rc, void* fn) {
  h->err = errno;
  double ms = (double)(np_now_ns() - h->t0) / 1e6;
  np_tl_call = 0;
  tl_depth--;
  if (!h->logging) return;
  np_jb_int(&h->jb, "rc", rc);
  np_jb_dbl(&h->jb, "ms", ms, 3);
  np_lib* lib = np_lib_of(fn);
  np_jb_str(&h->jb, "lib", lib ? lib->path : NULL);
  if (h->api < API_FINALIZE) {
    if (lib && lib->version) np_jb_int(&h->jb, "version", lib->version);
    else np_jb_null(&h->jb, "version");
    np_jb_bool(&h->jb, "simulated", lib && lib->simulated);
  }
  h->prefix = h->jb.len;
  h->prefix_truncated = h->jb.truncated;
}

/* rank/nranks/dev of a new communicator through the library that made it; the arguments' values
 * when it cannot be asked (failure, non-blocking init still in progress). */
static void finish_comm(struct hook* h, void* fn, ncclResult_t rc, ncclComm_t comm, int arg_rank, int arg_nranks) {
  if (!h->logging) return;
  h->jb.len = h->prefix;
  h->jb.truncated = h->prefix_truncated;
  int rank = arg_rank, nranks = arg_nranks, dev = INT_MIN;
  np_lib* lib = np_lib_of(fn);
  if (rc == ncclSuccess && comm && lib) {
    ncclCommQuery_fn q;
    int v;
    if ((q = (ncclCommQuery_fn)np_lib_sym(lib, "ncclCommUserRank")) && q(comm, &v) == ncclSuccess) rank = v;
    if ((q = (ncclCommQuery_fn)np_lib_sym(lib, "ncclCommCount")) && q(comm, &v) == ncclSuccess) nranks = v;
    if ((q = (ncclCommQuery_fn)np_lib_sym(lib, "ncclCommCuDevice")) && q(comm, &v) == ncclSuccess) dev = v;
  }
  np_jb_ptr(&h->jb, "comm", rc == ncclSuccess || rc == ncclInProgress ? (void*)comm : NULL);
  if (rank != INT_MIN) np_jb_int(&h->jb, "rank", rank); else np_jb_null(&h->jb, "rank");
  if (nranks != INT_MIN) np_jb_int(&h->jb, "nranks", nranks); else np_jb_null(&h->jb, "nranks");
  if (dev != INT_MIN) np_jb_int(&h->jb, "dev", dev); else np_jb_null(&h->jb, "dev");
  np_event_end(&h->jb);
}

/* ---------------------------------------------------------------- the hooks */

#define CALLER __builtin_extract_return_addr(__builtin_return_address(0))

/* Nested calls (NCCL or a simulated NCCL calling its own exported API) pass straight through;
 * past NP_MAX_NEST frames the call is refused rather than recursing until the stack overflows. */
#define PASS_THROUGH_IF_NESTED(api, type, ...)        \
  int entry_errno_ = errno;                           \
  type real = (type)resolve(api, CALLER);             \
  if (!real) {                                        \
    report_missing(api);                              \
    errno = entry_errno_;                             \
    return ncclInternalError;                         \
  }                                                   \
  if (tl_depth >= NP_MAX_NEST) {                      \
    report_cycle(api);                                \
    errno = entry_errno_;                             \
    return ncclInternalError;                         \
  }                                                   \
  errno = entry_errno_;                               \
  if (tl_depth > 0) {                                 \
    tl_depth++;                                       \
    ncclResult_t nested_rc_ = real(__VA_ARGS__);      \
    tl_depth--;                                       \
    return nested_rc_;                                \
  }

NP_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  PASS_THROUGH_IF_NESTED(API_INIT_RANK, ncclCommInitRank_fn, comm, nranks, commId, rank)
  char buf[NP_LINE_MAX];
  struct hook h;
  hook_begin(&h, buf, sizeof buf, API_INIT_RANK);
  if (h.logging) jb_uid(&h.jb, &commId, 1);
  hook_enter(&h);
  ncclResult_t rc = real(comm, nranks, commId, rank);
  hook_leave(&h, rc, (void*)real);
  finish_comm(&h, (void*)real, rc, comm ? *comm : NULL, rank, nranks);
  return hook_return(&h, rc);
}

NP_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                              ncclConfig_t* config) {
  PASS_THROUGH_IF_NESTED(API_INIT_RANK_CONFIG, ncclCommInitRankConfig_fn, comm, nranks, commId, rank, config)
  char buf[NP_LINE_MAX];
  struct hook h;
  hook_begin(&h, buf, sizeof buf, API_INIT_RANK_CONFIG);
  if (h.logging) {
    jb_uid(&h.jb, &commId, 1);
    jb_config(&h.jb, config);
  }
  hook_enter(&h);
  ncclResult_t rc = real(comm, nranks, commId, rank, config);
  hook_leave(&h, rc, (void*)real);
  finish_comm(&h, (void*)real, rc, comm ? *comm : NULL, rank, nranks);
  return hook_return(&h, rc);
}

NP_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  PASS_THROUGH_IF_NESTED(API_INIT_ALL, ncclCommInitAll_fn, comm, ndev, devlist)
  char buf[NP_LINE_MAX];
  struct hook h;
  hook_begin(&h, buf, sizeof buf, API_INIT_ALL);
  if (h.logging) {
    np_jb_int(&h.jb, "ndev", ndev);
    jb_int_array(&h.jb, "devlist", devlist, ndev);
  }
  hook_enter(&h);
  ncclResult_t rc = real(comm, ndev, devlist);
  hook_leave(&h, rc, (void*)real);
  /* One comm_init per communicator the call created, all with the same call id. */
  if (rc == ncclSuccess && comm && ndev > 0) {
    for (int i = 0; i < ndev; i++) finish_comm(&h, (void*)real, rc, comm[i], i, ndev);
  } else {
    finish_comm(&h, (void*)real, rc, NULL, INT_MIN, ndev);
  }
  return hook_return(&h, rc);
}

NP_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                ncclUniqueId* commIds, ncclConfig_t* config) {
  PASS_THROUGH_IF_NESTED(API_INIT_SCALABLE, ncclCommInitRankScalable_fn, newcomm, nranks, myrank, nId, commIds,
                         config)
  char buf[NP_LINE_MAX];
  struct hook h;
  hook_begin(&h, buf, sizeof buf, API_INIT_SCALABLE);
  if (h.logging) {
    np_jb_int(&h.jb, "nid", nId);
    jb_uid(&h.jb, commIds, nId);
    jb_config(&h.jb, config);
  }
  hook_enter(&h);
  ncclResult_t rc = real(newcomm, nranks, myrank, nId, commIds, config);
  hook_leave(&h, rc, (void*)real);
  finish_comm(&h, (void*)real, rc, newcomm ? *newcomm : NULL, myrank, nranks);
  return hook_return(&h, rc);
}

NP_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  PASS_THROUGH_IF_NESTED(API_SPLIT, ncclCommSplit_fn, comm, color, key, newcomm, config)
  char buf[NP_LINE_MAX];
  struct hook h;
  hook_begin(&h, buf, sizeof buf, API_SPLIT);
  if (h.logging) {
    np_jb_ptr(&h.jb, "parent", comm);
    np_jb_int(&h.jb, "color", color);
    np_jb_int(&h.jb, "key", key);
    jb_config(&h.jb, config);
  }
  hook_enter(&h);
  ncclResult_t rc = real(comm, color, key, newcomm, config);
  hook_leave(&h, rc, (void*)real);
  /* NCCL_SPLIT_NOCOLOR returns success with a NULL communicator. */
  finish_comm(&h, (void*)real, rc, newcomm ? *newcomm : NULL, INT_MIN, INT_MIN);
  return hook_return(&h, rc);
}

NP_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                      ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  PASS_THROUGH_IF_NESTED(API_SHRINK, ncclCommShrink_fn, comm, excludeRanksList, excludeRanksCount, newcomm, config,
                         shrinkFlags)
  char buf[NP_LINE_MAX];
  struct hook h;
  hook_begin(&h, buf, sizeof buf, API_SHRINK);
  if (h.logging) {
    np_jb_ptr(&h.jb, "parent", comm);
    jb_int_array(&h.jb, "exclude", excludeRanksList, excludeRanksCount);
    np_jb_int(&h.jb, "flags", shrinkFlags);
    jb_config(&h.jb, config);
  }
  hook_enter(&h);
  ncclResult_t rc = real(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
  hook_leave(&h, rc, (void*)real);
  finish_comm(&h, (void*)real, rc, newcomm ? *newcomm : NULL, INT_MIN, INT_MIN);
  return hook_return(&h, rc);
}

NP_EXPORT ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                                    ncclComm_t* newcomm, ncclConfig_t* config) {
  PASS_THROUGH_IF_NESTED(API_GROW, ncclCommGrow_fn, comm, nRanks, uniqueId, rank, newcomm, config)
  char buf[NP_LINE_MAX];
  struct hook h;
  hook_begin(&h, buf, sizeof buf, API_GROW);
  if (h.logging) {
    np_jb_ptr(&h.jb, "parent", comm);
    jb_uid(&h.jb, uniqueId, uniqueId ? 1 : 0);
    jb_config(&h.jb, config);
  }
  hook_enter(&h);
  ncclResult_t rc = real(comm, nRanks, uniqueId, rank, newcomm, config);
  hook_leave(&h, rc, (void*)real);
  /* Existing ranks pass rank=-1 (nccl.h.in): the new rank is only known by asking. */
  finish_comm(&h, (void*)real, rc, newcomm ? *newcomm : NULL, rank >= 0 ? rank : INT_MIN, nRanks);
  return hook_return(&h, rc);
}

static ncclResult_t end_comm(int api, ncclCommFinalize_fn real, ncclComm_t comm) {
  char buf[1024];
  struct hook h;
  hook_begin(&h, buf, sizeof buf, api);
  if (h.logging) np_jb_ptr(&h.jb, "comm", comm);
  hook_enter(&h);
  ncclResult_t rc = real(comm);
  hook_leave(&h, rc, (void*)real);
  if (h.logging) np_event_end(&h.jb);
  return hook_return(&h, rc);
}

NP_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  PASS_THROUGH_IF_NESTED(API_FINALIZE, ncclCommFinalize_fn, comm)
  return end_comm(API_FINALIZE, real, comm);
}

NP_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  PASS_THROUGH_IF_NESTED(API_DESTROY, ncclCommFinalize_fn, comm)
  return end_comm(API_DESTROY, real, comm);
}

NP_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  PASS_THROUGH_IF_NESTED(API_ABORT, ncclCommFinalize_fn, comm)
  return end_comm(API_ABORT, real, comm);
}
