/* envplugin.c - the NCCL env plugin role (NCCL_ENV_PLUGIN=<this library>, NCCL >= 2.28.7).
 *
 * From 2.28.7 every variable NCCL reads goes through ncclGetEnv -> the env plugin's getEnv
 * (v2.28.7-1 src/misc/param.cc). We delegate to getenv, exactly what NCCL's default plugin does
 * (src/plugin/env/default_env.cc), so NCCL sees the same values and the same pointer lifetime, and
 * log each distinct (variable, value) that one library copy read, once, for watched names only.
 * NCCL looks up ncclEnvPlugin_v2 first, then v1 (v2.30.7-1 src/plugin/env.cc). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "probe.h"

/* NCCL 2.30.7 with the efficiency CTA policy reads NCCL_ALGO and NCCL_PROTO through ncclGetEnv on
 * every collective (src/enqueue.cc), so a read of a value already logged must cost no more than
 * getenv: the library is found by the caller's address in a small lock-free array, and the
 * (library, variable, value) hash in the append-only seen-table by lock-free probing. Only a first
 * sight takes the lock, asks whether the log is open and writes a line. */
#define NP_SEEN_SLOTS 4096 /* open addressing, kept at most half full */
#define NP_SEEN_MAX (NP_SEEN_SLOTS / 2)

static uint64_t g_seen[NP_SEEN_SLOTS]; /* 0 = empty; a slot, once set, never changes */
static int g_nseen;
static int g_overflow_once;
pthread_mutex_t np_seen_lock = PTHREAD_MUTEX_INITIALIZER; /* inserts only */

static uint64_t seen_hash(const void* lib_base, const char* name, const char* value) {
  uint64_t h = np_fnv1a(&lib_base, sizeof lib_base, NP_FNV_OFFSET);
  h = np_fnv1a(name, strlen(name) + 1, h);
  h = value ? np_fnv1a(value, strlen(value), h ^ 0x5a) : np_fnv1a("\0unset", 6, h);
  return h ? h : 1;
}

/* Lock-free: 1 if h is in the table. A concurrent insert may be missed (then first_sight, under
 * the lock, finds it). */
static int seen(uint64_t h) {
  for (size_t i = h % NP_SEEN_SLOTS;; i = (i + 1) % NP_SEEN_SLOTS) {
    uint64_t v = __atomic_load_n(&g_seen[i], __ATOMIC_ACQUIRE);
    if (v == h) return 1;
    if (!v) return 0;
  }
}

/* 1: first time this library copy read this value of this variable; 0: seen; -1: table full. */
static int first_sight(uint64_t h) {
  int result = 0;
  pthread_mutex_lock(&np_seen_lock);
  for (size_t i = h % NP_SEEN_SLOTS;; i = (i + 1) % NP_SEEN_SLOTS) {
    if (g_seen[i] == h) break;
    if (!g_seen[i]) {
      if (g_nseen >= NP_SEEN_MAX) {
        result = -1;
      } else {
        __atomic_store_n(&g_seen[i], h, __ATOMIC_RELEASE);
        g_nseen++;
        result = 1;
      }
      break;
    }
  }
  pthread_mutex_unlock(&np_seen_lock);
  return result;
}

/* Return address -> library, for the few call sites that read through the plugin (one per NCCL
 * copy: ncclGetEnv). A slot is claimed with a CAS, filled, then published by storing its key. */
#define NP_CALLERS 16
static struct {
  const void* ret; /* published last */
  np_lib* lib;
  int claimed;
} g_callers[NP_CALLERS];

static np_lib* lib_of_caller(const void* ret) {
  for (int i = 0; i < NP_CALLERS; i++)
    if (__atomic_load_n(&g_callers[i].ret, __ATOMIC_ACQUIRE) == ret) return g_callers[i].lib;
  np_lib* lib = np_lib_of(ret);
  for (int i = 0; i < NP_CALLERS; i++) {
    int expected = 0;
    if (__atomic_compare_exchange_n(&g_callers[i].claimed, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
      g_callers[i].lib = lib;
      __atomic_store_n(&g_callers[i].ret, ret, __ATOMIC_RELEASE);
      break;
    }
  }
  return lib; /* array full: looked up again next time */
}

#define CALLER __builtin_extract_return_addr(__builtin_return_address(0))

static void log_first_read(np_lib* lib, const char* name, const char* value, uint64_t h) {
  if (!np_log_enabled()) return;
  int first = first_sight(h);
  if (first < 0) {
    np_probe_error("envplugin", "getenv table", &g_overflow_once,
                   "more than 2048 distinct variable values read; later nccl_getenv events are not logged");
  } else if (first) {
    char buf[8192];
    np_jb jb;
    np_jb_init(&jb, buf, sizeof buf);
    np_event_begin(&jb, "nccl_getenv", "envplugin");
    np_jb_str(&jb, "var", name);
    np_jb_str(&jb, "value", value);
    np_jb_str(&jb, "lib", lib ? lib->path : NULL);
    np_event_end(&jb);
  }
}

static const char* get_env(const char* name) {
  if (!name) return NULL;
  const char* value = getenv(name);
  if (!np_watched(name, strlen(name))) return value;
  np_lib* lib = lib_of_caller(CALLER);
  uint64_t h = seen_hash(lib ? lib->base : NULL, name, value);
  if (seen(h)) return value;
  if (__atomic_load_n(&g_nseen, __ATOMIC_RELAXED) >= NP_SEEN_MAX && __atomic_load_n(&g_overflow_once, __ATOMIC_RELAXED))
    return value; /* full and already reported: nothing more will ever be logged */
  int saved = errno;
  log_first_read(lib, name, value, h);
  errno = saved;
  return value;
}

static int g_load_once_nolib;

static void plugin_load(const void* caller, const char* plugin, uint8_t major, uint8_t minor, uint8_t patch,
                        const char* suffix) {
  if (!np_log_enabled()) return;
  np_lib* lib = np_lib_of(caller);
  int* once = lib ? &lib->envplugin_seen : &g_load_once_nolib;
  if (__atomic_exchange_n(once, 1, __ATOMIC_RELAXED)) return;
  char buf[2048];
  np_jb jb;
  np_jb_init(&jb, buf, sizeof buf);
  np_event_begin(&jb, "plugin_load", "envplugin");
  np_jb_str(&jb, "plugin", plugin);
  /* init receives NCCL_MAJOR/MINOR/PATCH; NCCL_VERSION_CODE is X*10000+Y*100+Z since 2.9. */
  np_jb_int(&jb, "nccl_version", NCCL_ABI_VERSION(major, minor, patch));
  np_jb_str(&jb, "nccl_suffix", suffix);
  np_jb_str(&jb, "lib", lib ? lib->path : NULL);
  np_event_end(&jb);
}

/* errno as NCCL left it: the log's first open can set it (mkdir of an existing directory). */
static ncclResult_t init_v1(uint8_t major, uint8_t minor, uint8_t patch, const char* suffix) {
  int saved = errno;
  plugin_load(CALLER, "ncclEnvPlugin_v1", major, minor, patch, suffix);
  errno = saved;
  return ncclSuccess;
}

static ncclResult_t init_v2(uint8_t major, uint8_t minor, uint8_t patch, const char* suffix,
                            ncclDebugLogger_t logFunction) {
  int saved = errno;
  plugin_load(CALLER, "ncclEnvPlugin_v2", major, minor, patch, suffix);
  errno = saved;
  return ncclSuccess;
}

/* Nothing to release: getenv's pointers belong to the environment (env_v1.h lifetime rule). */
static ncclResult_t finalize(void) { return ncclSuccess; }

NP_EXPORT const ncclEnv_v1_t ncclEnvPlugin_v1 = {"ncclprobe", init_v1, finalize, get_env};
NP_EXPORT const ncclEnv_v2_t ncclEnvPlugin_v2 = {"ncclprobe", init_v2, finalize, get_env};
