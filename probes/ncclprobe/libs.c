/* libs.c - the loaded NCCL library copies the probes meet (through a resolved function, or as the
 * caller of a plugin entry point), each with its path, version and whether it is the simulated
 * NCCL. A process may hold several copies (SGLang/vLLM ctypes loads, reference/nccl-internals.md
 * §5.4), so everything is keyed by load address. Fixed table, append-only, lock-free reads.
 *
 * The lock only claims a slot (key and path). The handle, version and simulated flag are filled
 * after it is released: dlopen takes the loader lock and ncclGetVersion is a foreign function,
 * and neither may run under a lock every other thread's first sight of a library needs. */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "probe.h"

#define NP_MAX_LIBS 16

static np_lib g_libs[NP_MAX_LIBS];
static int g_nlibs; /* published with release after the entry is filled */
pthread_mutex_t np_libs_lock = PTHREAD_MUTEX_INITIALIZER;

uint64_t np_fnv1a(const void* data, size_t n, uint64_t h) {
  const unsigned char* p = (const unsigned char*)data;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

void* np_self_base(void) {
  static void* base;
  void* b = __atomic_load_n(&base, __ATOMIC_RELAXED);
  if (!b) {
    Dl_info info;
    if (dladdr((void*)&np_self_base, &info) && info.dli_fbase) b = info.dli_fbase;
    __atomic_store_n(&base, b, __ATOMIC_RELAXED);
  }
  return b;
}

/* dlsym on a library's handle searches its dependencies too: only accept a symbol that the
 * library itself defines. */
static void* own_sym(void* handle, void* base, const char* name) {
  if (!handle) return NULL;
  void* p = dlsym(handle, name);
  Dl_info info;
  if (!p || !dladdr(p, &info) || info.dli_fbase != base) return NULL;
  return p;
}

void* np_lib_sym(np_lib* lib, const char* name) {
  return own_sym(__atomic_load_n(&lib->handle, __ATOMIC_ACQUIRE), lib->base, name);
}

/* Handle, version and simulated flag of a claimed entry, without any lock held. Two threads
 * meeting a new library at once both fill it, with the same values; one handle is kept. */
static void fill(np_lib* lib) {
  /* RTLD_NOLOAD: only a reference to the copy already mapped, never a new load. Kept open so
   * that the library cannot be unmapped under a cached function pointer. */
  void* h = lib->path[0] ? dlopen(lib->path, RTLD_NOLOAD | RTLD_LAZY) : NULL;
  int v = 0, simulated = 0;
  if (h) {
    ncclGetVersion_fn getv = (ncclGetVersion_fn)own_sym(h, lib->base, "ncclGetVersion");
    /* ncclGetVersion only stores NCCL_VERSION_CODE: no init side effects (src/init.cc). */
    if (!getv || getv(&v) != ncclSuccess) v = 0;
    simulated = own_sym(h, lib->base, "ncclSimulated") != NULL;
    void* none = NULL;
    if (!__atomic_compare_exchange_n(&lib->handle, &none, h, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) dlclose(h);
  }
  __atomic_store_n(&lib->version, v, __ATOMIC_RELAXED);
  __atomic_store_n(&lib->simulated, simulated, __ATOMIC_RELAXED);
  __atomic_store_n(&lib->ready, 1, __ATOMIC_RELEASE);
}

np_lib* np_lib_of(const void* addr) {
  Dl_info info;
  if (!addr || !dladdr(addr, &info) || !info.dli_fbase) return NULL;
  np_lib* found = NULL;
  int n = __atomic_load_n(&g_nlibs, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n && !found; i++)
    if (g_libs[i].base == info.dli_fbase) found = &g_libs[i];

  if (!found) {
    pthread_mutex_lock(&np_libs_lock);
    n = g_nlibs;
    for (int i = 0; i < n && !found; i++)
      if (g_libs[i].base == info.dli_fbase) found = &g_libs[i];
    if (!found && n < NP_MAX_LIBS) {
      np_lib* lib = &g_libs[n];
      memset(lib, 0, sizeof *lib);
      lib->base = info.dli_fbase;
      strncpy(lib->path, info.dli_fname ? info.dli_fname : "", sizeof lib->path - 1);
      __atomic_store_n(&g_nlibs, n + 1, __ATOMIC_RELEASE);
      found = lib;
    }
    pthread_mutex_unlock(&np_libs_lock);
  }
  if (found && !__atomic_load_n(&found->ready, __ATOMIC_ACQUIRE)) fill(found);
  return found;
}
