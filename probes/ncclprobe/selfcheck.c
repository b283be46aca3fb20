/* selfcheck.c - what the Python side (ncclprobe/probelib.py) asks the library through ctypes
 * before `ncclprobe run` trusts it: its ABI version, the roles it really exports, and pure helpers
 * that let the tests hold the C side to the Python contracts (watched set, JSON, id spelling). */
#include <dlfcn.h>
#include <string.h>

#include "probe.h"

NP_EXPORT const char* ncclprobe_version(void) { return NCCLPROBE_ABI; }

/* Roles whose entry points NCCL or the dynamic linker can actually find: looked up through our
 * own handle, so a symbol hidden by a visibility mistake does not count. */
NP_EXPORT unsigned ncclprobe_roles(void) {
  Dl_info info;
  if (!dladdr((void*)&ncclprobe_roles, &info) || !info.dli_fname) return 0;
  void* self = dlopen(info.dli_fname, RTLD_NOLOAD | RTLD_LAZY);
  if (!self) return 0;
  static const char* const preload[] = {"ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitAll",
                                        "ncclCommInitRankScalable", "ncclCommSplit", "ncclCommShrink",
                                        "ncclCommGrow", "ncclCommFinalize", "ncclCommDestroy", "ncclCommAbort"};
  static const char* const profiler[] = {"ncclProfiler_v4", "ncclProfiler_v5", "ncclProfiler_v6",
                                         "ncclProfiler_v7"};
  static const char* const env[] = {"ncclEnvPlugin_v1", "ncclEnvPlugin_v2"};
  unsigned roles = NP_ROLE_PRELOAD | NP_ROLE_PROFILER | NP_ROLE_ENVPLUGIN;
  for (size_t i = 0; i < sizeof preload / sizeof preload[0]; i++)
    if (!dlsym(self, preload[i])) roles &= ~(unsigned)NP_ROLE_PRELOAD;
  for (size_t i = 0; i < sizeof profiler / sizeof profiler[0]; i++)
    if (!dlsym(self, profiler[i])) roles &= ~(unsigned)NP_ROLE_PROFILER;
  for (size_t i = 0; i < sizeof env / sizeof env[0]; i++)
    if (!dlsym(self, env[i])) roles &= ~(unsigned)NP_ROLE_ENVPLUGIN;
  dlclose(self);
  return roles;
}

/* 1 if the C side would log this variable (must agree with ncclprobe.watched.is_watched). */
NP_EXPORT int ncclprobe_watched(const char* name) { return name && np_watched(name, strlen(name)); }

/* The JSON string body the probes write for n bytes of `in`; 0 if `out` (which needs NP_JB_TAIL
 * bytes of slack) is too small. */
NP_EXPORT size_t ncclprobe_json_escape(const char* in, size_t n, char* out, size_t cap) {
  return np_json_escape(in, n, out, cap);
}

/* The spelling every probe writes for a 64-bit id (must agree with ncclprobe.model.comm_id); `out`
 * takes NP_ID_CHARS (19) bytes. */
NP_EXPORT void ncclprobe_id_text(uint64_t v, char* out) { np_id_text(out, v); }
