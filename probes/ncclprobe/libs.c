/* libs.c - the loaded NCCL library copies the probes meet (through a resolved function, or as the
 * caller of a plugin entry point), each with its path, version and whether it is the simulated
 * NCCL. A process may hold several copies (SGLang/vLLM ctypes loads, reference/nccl-internals.md
 * §5.4), so everything is keyed by load address. Fixed table, append-only, lock-free reads. */
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

/* dlsym on the library's handle searches its dependencies too: only accept a symbol that the
 * library itself defines. */
void* np_lib_sym(np_lib* lib, const char* name) {
  if (!lib->handle) return NULL;
  void* p = dlsym(lib->handle, name);
  Dl_info info;
  if (!p || !dladdr(p, &info) || info.dli_fbase != lib->base) return NULL;
  return p;
}

np_lib* np_lib_of(const void* addr) {
  Dl_info info;
  if (!addr || !dladdr(addr, &info) || !info.dli_fbase) return NULL;
  int n = __atomic_load_n(&g_nlibs, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (g_libs[i].base == info.dli_fbase) return &g_libs[i];

  np_lib* found = NULL;
  pthread_mutex_lock(&np_libs_lock);
  n = g_nlibs;
  for (int i = 0; i < n && !found; i++)
    if (g_libs[i].base == info.dli_fbase) found = &g_libs[i];
  if (!found && n < NP_MAX_LIBS) {
    np_lib* lib = &g_libs[n];
    memset(lib, 0, sizeof *lib);
    lib->base = info.dli_fbase;
    const char* fname = info.dli_fname ? info.dli_fname : "";
    strncpy(lib->path, fname, sizeof lib->path - 1);
    /* RTLD_NOLOAD: only a reference to the copy already mapped, never a new load. Kept open so
     * that the library cannot be unmapped under a cached function pointer. */
    lib->handle = fname[0] ? dlopen(fname, RTLD_NOLOAD | RTLD_LAZY) : NULL;
    ncclGetVersion_fn getv = (ncclGetVersion_fn)np_lib_sym(lib, "ncclGetVersion");
    int v = 0;
    /* ncclGetVersion only stores NCCL_VERSION_CODE: no init side effects (src/init.cc). */
    if (getv && getv(&v) == ncclSuccess) lib->version = v;
    lib->simulated = np_lib_sym(lib, "ncclSimulated") != NULL;
    __atomic_store_n(&g_nlibs, n + 1, __ATOMIC_RELEASE);
    found = lib;
  }
  pthread_mutex_unlock(&np_libs_lock);
  return found;
}
