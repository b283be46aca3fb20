/* env.c - how NCCL 2.28.9 reads its environment (src/misc/param.cc, src/plugin/env.cc,
 * src/graph/paths.cc), reproduced:
 *  - the first lookup applies $NCCL_CONF_FILE (else ~/.nccl.conf, home from getpwuid), then
 *    /etc/nccl.conf, each line with setenv(name, value, 0): a real variable always wins;
 *  - then loads NCCL_ENV_PLUGIN (dlopen, "ncclEnvPlugin_v1"), through which every later lookup goes;
 *  - NCCL_PARAM values are cached per process at their first read and logged once.
 * Sim-only knobs (never NCCL's): NCCLSIM_HOME replaces the getpwuid home, NCCLSIM_ETC_NCCL_CONF
 * replaces /etc/nccl.conf, so tests need not touch the real files.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "sim.h"

static pthread_once_t envOnce = PTHREAD_ONCE_INIT;
static ncclEnv_v1_t* envPlugin; /* NULL: built-in getenv */
static void* envPluginLib;

static void setEnvFile(const char* path) {
  FILE* f = fopen(path, "r");
  if (!f) return;
  char* line = NULL;
  size_t cap = 0;
  ssize_t len;
  while ((len = getline(&line, &cap, f)) != -1) {
    if (line[0] == '#') continue; /* comments from 2.26 */
    if (len > 0 && line[len - 1] == '\n') line[len - 1] = '\0';
    char* eq = strchr(line, '=');
    if (!eq || eq == line) continue;
    *eq = '\0';
    char name[1024], value[1024];
    snprintf(name, sizeof(name), "%s", line);
    snprintf(value, sizeof(value), "%s", eq + 1);
    setenv(name, value, 0); /* never overrides the process environment */
  }
  free(line);
  fclose(f);
}

static void finalizeEnvPlugin(void) {
  if (envPlugin && envPlugin->finalize) envPlugin->finalize();
}

static void loadEnvPlugin(void) {
  const char* name = getenv("NCCL_ENV_PLUGIN");
  char alt[PATH_MAX];
  if (name) {
    INFO(SIM_ENV, "NCCL_ENV_PLUGIN set by environment to %s", name);
    if (strcasecmp(name, "none") == 0) return;
    envPluginLib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!envPluginLib && !strchr(name, '/')) { /* plugin_open.cc: then libnccl-env-<name>.so */
      snprintf(alt, sizeof(alt), "libnccl-env-%s.so", name);
      envPluginLib = dlopen(alt, RTLD_NOW | RTLD_LOCAL);
    }
  } else {
    envPluginLib = dlopen("libnccl-env.so", RTLD_NOW | RTLD_LOCAL);
  }
  if (!envPluginLib) {
    if (name) INFO(SIM_INIT | SIM_ENV, "ENV/Plugin: Could not load %s: %s", name, dlerror());
    return;
  }
  ncclEnv_v1_t* p = (ncclEnv_v1_t*)dlsym(envPluginLib, "ncclEnvPlugin_v1");
  if (!p || !p->getEnv) {
    INFO(SIM_INIT, "External env plugin %s is unsupported", name ? name : "libnccl-env.so");
    dlclose(envPluginLib);
    envPluginLib = NULL;
    return;
  }
  INFO(SIM_INIT | SIM_ENV, "ENV/Plugin: Using %s (v1)", p->name ? p->name : "(null)");
  if (p->init && p->init(SIM_MAJOR, SIM_MINOR, SIM_PATCH, SIM_SUFFIX) != ncclSuccess) {
    INFO(SIM_INIT | SIM_ENV, "ENV/Plugin: init failed, using the built-in environment");
    return;
  }
  envPlugin = p;
  INFO(SIM_INIT, "Successfully loaded external env plugin %s", name ? name : "libnccl-env.so");
  atexit(finalizeEnvPlugin);
}

static void initEnvOnce(void) {
  char path[PATH_MAX];
  const char* user = getenv("NCCL_CONF_FILE");
  if (user && user[0]) { /* 2.23+: replaces ~/.nccl.conf */
    setEnvFile(user);
  } else {
    const char* home = getenv("NCCLSIM_HOME");
    if (!home || !home[0]) {
      struct passwd* pw = getpwuid(getuid());
      home = pw ? pw->pw_dir : NULL;
    }
    if (home) {
      snprintf(path, sizeof(path), "%s/.nccl.conf", home);
      setEnvFile(path);
    }
  }
  const char* etc = getenv("NCCLSIM_ETC_NCCL_CONF");
  setEnvFile(etc && etc[0] ? etc : "/etc/nccl.conf");
  simDebugInit(); /* conf files may set NCCL_DEBUG */
  loadEnvPlugin();
}

void simInitEnv(void) { pthread_once(&envOnce, initEnvOnce); }

const char* simGetEnv(const char* name) {
  if (!name) return NULL;
  simInitEnv();
  return envPlugin ? envPlugin->getEnv(name) : getenv(name);
}

/* ------------------------------------------------------------------ NCCL_PARAM */

static pthread_mutex_t paramLock = PTHREAD_MUTEX_INITIALIZER;

#define PARAM(var, key, def) simParam var = {key, def, 0, 0}
PARAM(simParamMinNchannels, "MIN_NCHANNELS", -2);
PARAM(simParamMaxNchannels, "MAX_NCHANNELS", -2);
PARAM(simParamBuffSize, "BUFFSIZE", -2);
PARAM(simParamLlBuffSize, "LL_BUFFSIZE", -2);
PARAM(simParamLl128BuffSize, "LL128_BUFFSIZE", -2);
PARAM(simParamNthreads, "NTHREADS", -2);
PARAM(simParamLl128Nthreads, "LL128_NTHREADS", -2);
PARAM(simParamShmDisable, "SHM_DISABLE", 0);
PARAM(simParamIbDisable, "IB_DISABLE", 0);
PARAM(simParamNvlsEnable, "NVLS_ENABLE", 2);
PARAM(simParamCuMemEnable, "CUMEM_ENABLE", -2);
PARAM(simParamCrossNic, "CROSS_NIC", 2);
PARAM(simParamGraphMixing, "GRAPH_MIXING_SUPPORT", 1);
PARAM(simParamMinCTAs, "MIN_CTAS", NCCL_CONFIG_UNDEF_INT);
PARAM(simParamMaxCTAs, "MAX_CTAS", NCCL_CONFIG_UNDEF_INT);
PARAM(simParamCGAClusterSize, "CGA_CLUSTER_SIZE", NCCL_CONFIG_UNDEF_INT);
PARAM(simParamCommBlocking, "COMM_BLOCKING", NCCL_CONFIG_UNDEF_INT);
PARAM(simParamSplitShare, "COMM_SPLIT_SHARE_RESOURCES", NCCL_CONFIG_UNDEF_INT);
PARAM(simParamCtaPolicy, "CTA_POLICY", NCCL_CONFIG_UNDEF_INT);
PARAM(simParamNvlsChannels, "NVLS_NCHANNELS", NCCL_CONFIG_UNDEF_INT);

/* ncclLoadParam: the first call reads and logs; every later call returns the cache (param.h) */
int64_t simParamGet(simParam* p) {
  if (__atomic_load_n(&p->loaded, __ATOMIC_ACQUIRE)) return p->value;
  char env[128];
  snprintf(env, sizeof(env), "NCCL_%s", p->name);
  const char* str = simGetEnv(env);
  pthread_mutex_lock(&paramLock);
  if (!p->loaded) {
    int64_t v = p->deflt;
    if (str && str[0]) {
      errno = 0;
      v = strtoll(str, NULL, 0);
      if (errno) {
        v = p->deflt;
        INFO(SIM_ALL, "Invalid value %s for %s, using default %lld.", str, env, (long long)p->deflt);
      } else {
        INFO(SIM_ENV, "%s set by environment to %lld.", env, (long long)v);
      }
    }
    p->value = v;
    __atomic_store_n(&p->loaded, 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&paramLock);
  return p->value;
}

/* ------------------------------------------------------------------ path levels (paths.cc) */

static const char* pathStr[] = {"LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS"};
enum { PATH_LOC = 0, PATH_PIX = 4, PATH_PXB = 5, PATH_PHB = 8, PATH_SYS = 9 };
static const int oldLevels[] = {PATH_LOC, PATH_PIX, PATH_PXB, PATH_PHB, PATH_SYS, PATH_SYS};

/* static global, set at first use; NCCL_NO_CACHE would not reach it either */
static int getLevel(int* cache, const char* disableEnv, const char* levelEnv) {
  pthread_mutex_lock(&paramLock);
  int done = *cache != -1;
  pthread_mutex_unlock(&paramLock);
  if (done) return *cache;
  int l = -1;
  if (disableEnv) {
    const char* s = simGetEnv(disableEnv);
    if (s) {
      int disable = (int)strtol(s, NULL, 0);
      if (disable == 1) l = PATH_LOC;
      if (l >= 0) INFO(SIM_ALL, "%s set by environment to %d", disableEnv, disable);
    }
  }
  if (l == -1) {
    const char* s = simGetEnv(levelEnv);
    if (s) {
      for (int i = 0; i <= PATH_SYS; i++)
        if (strcmp(s, pathStr[i]) == 0) { l = i; break; }
      if (l == -1 && s[0] >= '0' && s[0] <= '9') {
        long old = strtol(s, NULL, 0);
        if (old > 5) old = 5;
        if (old >= 0) l = oldLevels[old];
      }
      if (l >= 0) INFO(SIM_ALL, "%s set by environment to %s", levelEnv, pathStr[l]);
    }
  }
  pthread_mutex_lock(&paramLock);
  if (*cache == -1) *cache = l >= 0 ? l : -2;
  l = *cache;
  pthread_mutex_unlock(&paramLock);
  return l;
}

static int p2pLevel = -1, gdrLevel = -1;
int simP2pLevel(void) { return getLevel(&p2pLevel, "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL"); }
int simGdrLevel(void) { return getLevel(&gdrLevel, NULL, "NCCL_NET_GDR_LEVEL"); }

/* What a first comm init reads in NCCL (topology, transports, buffers, threads); all cached. */
void simReadProcessParams(void) {
  simParam* all[] = {&simParamCuMemEnable, &simParamNvlsEnable, &simParamShmDisable, &simParamIbDisable,
                     &simParamCrossNic, &simParamGraphMixing, &simParamBuffSize, &simParamLlBuffSize,
                     &simParamLl128BuffSize, &simParamNthreads, &simParamLl128Nthreads,
                     &simParamMinNchannels, &simParamMaxNchannels};
  for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) simParamGet(all[i]);
  simP2pLevel();
  simGdrLevel();
}
