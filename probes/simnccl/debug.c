/* debug.c - NCCL_DEBUG output in NCCL's line formats (src/debug.cc of 2.28.9):
 *   host:pid:tid [dev] NCCL INFO msg
 *   \n[ts] host:pid:tid [dev] file:line NCCL WARN msg   (timestamps on WARN only, the 2.26+ default)
 *   NCCL version ...                                   (bare, at NCCL_DEBUG=VERSION|WARN)
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "sim.h"

static pthread_mutex_t debugLock = PTHREAD_MUTEX_INITIALIZER;
static int debugLevel = -1; /* -1: not initialised */
static unsigned long debugMask = SIM_INIT | SIM_BOOTSTRAP | SIM_ENV; /* 2.23+ default */
static FILE* debugFile;
static char hostname[256];
static char lastError[1024];
static __thread int threadDev = -1;

void simSetThreadDev(int dev) { threadDev = dev; }

static const struct { const char* name; unsigned long bit; } subsys[] = {
    {"INIT", SIM_INIT},   {"COLL", SIM_COLL},   {"P2P", SIM_P2P},     {"SHM", SIM_SHM},
    {"NET", SIM_NET},     {"GRAPH", SIM_GRAPH}, {"TUNING", SIM_TUNING}, {"ENV", SIM_ENV},
    {"ALLOC", SIM_ALLOC}, {"CALL", SIM_CALL},   {"PROXY", SIM_PROXY}, {"NVLS", SIM_NVLS},
    {"BOOTSTRAP", SIM_BOOTSTRAP}, {"REG", SIM_REG}, {"PROFILE", SIM_PROFILE}, {"RAS", SIM_RAS},
    {"ALL", SIM_ALL},
};

static unsigned long parseSubsys(const char* env) {
  /* comma list; a leading ^ inverts the whole mask (src/debug.cc) */
  int invert = env[0] == '^';
  unsigned long mask = 0;
  char buf[512];
  snprintf(buf, sizeof(buf), "%s", env + invert);
  char* save = NULL;
  for (char* tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    for (size_t i = 0; i < sizeof(subsys) / sizeof(subsys[0]); i++)
      if (strcasecmp(tok, subsys[i].name) == 0) mask |= subsys[i].bit;
  }
  return invert ? ~mask : mask;
}

static void openDebugFile(const char* pattern) {
  /* %h host, %p pid, %% percent; anything else after % is echoed (src/debug.cc) */
  char path[4096];
  size_t n = 0;
  for (const char* c = pattern; *c && n < sizeof(path) - 1; c++) {
    if (*c != '%' || c[1] == '\0') { path[n++] = *c; continue; }
    c++;
    int w = 0;
    if (*c == '%') w = snprintf(path + n, sizeof(path) - n, "%%");
    else if (*c == 'h') w = snprintf(path + n, sizeof(path) - n, "%s", hostname);
    else if (*c == 'p') w = snprintf(path + n, sizeof(path) - n, "%d", (int)getpid());
    else w = snprintf(path + n, sizeof(path) - n, "%%%c", *c);
    n += (w > 0) ? (size_t)w : 0;
    if (n >= sizeof(path)) n = sizeof(path) - 1;
  }
  path[n] = '\0';
  if (path[0] == '\0') return;
  FILE* f = fopen(path, "w");
  if (f) {
    setlinebuf(f);
    debugFile = f;
  }
}

/* Called with debugLock held. Reads NCCL_DEBUG* with getenv: NCCL reads them before the env plugin
 * can log its own loading (ncclDebugInit runs from the first INFO). */
static void debugInitLocked(void) {
  if (debugLevel >= 0) return;
  gethostname(hostname, sizeof(hostname) - 1);
  char* dot = strchr(hostname, '.'); /* NCCL cuts the host name at the first '.' */
  if (dot) *dot = '\0';
  const char* lvl = getenv("NCCL_DEBUG");
  int level = NCCL_LOG_NONE;
  if (lvl) {
    if (strcasecmp(lvl, "VERSION") == 0) level = NCCL_LOG_VERSION;
    else if (strcasecmp(lvl, "WARN") == 0) level = NCCL_LOG_WARN;
    else if (strcasecmp(lvl, "INFO") == 0) level = NCCL_LOG_INFO;
    else if (strcasecmp(lvl, "ABORT") == 0) level = NCCL_LOG_ABORT;
    else if (strcasecmp(lvl, "TRACE") == 0) level = NCCL_LOG_TRACE;
  }
  const char* sub = getenv("NCCL_DEBUG_SUBSYS");
  if (sub && sub[0]) debugMask = parseSubsys(sub);
  debugFile = stdout;
  const char* file = getenv("NCCL_DEBUG_FILE");
  if (level > NCCL_LOG_VERSION && file) openDebugFile(file);
  __atomic_store_n(&debugLevel, level, __ATOMIC_RELEASE);
}

void simDebugInit(void) {
  pthread_mutex_lock(&debugLock);
  debugInitLocked();
  pthread_mutex_unlock(&debugLock);
}

int simDebugLevel(void) {
  if (__atomic_load_n(&debugLevel, __ATOMIC_ACQUIRE) < 0) simDebugInit();
  return debugLevel;
}

const char* simLastError(void) { return lastError; }

static const char* baseName(const char* path) {
  const char* s = strrchr(path, '/');
  return s ? s + 1 : path;
}

void simLog(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  va_list ap;
  pthread_mutex_lock(&debugLock);
  if (level == NCCL_LOG_WARN) { /* NCCL keeps the last WARN for ncclGetLastError, printed or not */
    va_start(ap, fmt);
    vsnprintf(lastError, sizeof(lastError), fmt, ap);
    va_end(ap);
  }
  debugInitLocked();
  if (debugLevel < (int)level || (level != NCCL_LOG_VERSION && (flags & debugMask) == 0) || !debugFile) {
    pthread_mutex_unlock(&debugLock);
    return;
  }
  char buf[1024];
  size_t n = 0;
  int w = 0;
  if (level == NCCL_LOG_WARN) {
    buf[n++] = '\n';
    time_t now = time(NULL);
    struct tm tmv;
    localtime_r(&now, &tmv);
    n += strftime(buf + n, sizeof(buf) - n, "[%F %T] ", &tmv);
  }
  int dev = threadDev >= 0 ? threadDev : 0;
  long tid = syscall(SYS_gettid);
  if (level == NCCL_LOG_WARN)
    w = snprintf(buf + n, sizeof(buf) - n, "%s:%d:%ld [%d] %s:%d NCCL WARN ", hostname, (int)getpid(), tid, dev,
                 baseName(file), line);
  else if (level == NCCL_LOG_INFO || level == NCCL_LOG_TRACE)
    w = snprintf(buf + n, sizeof(buf) - n, "%s:%d:%ld [%d] NCCL INFO ", hostname, (int)getpid(), tid, dev);
  if (w > 0) n += (size_t)w;
  if (n >= sizeof(buf)) n = sizeof(buf) - 1;
  va_start(ap, fmt);
  w = vsnprintf(buf + n, sizeof(buf) - n, fmt, ap);
  va_end(ap);
  if (w > 0) n += (size_t)w;
  if (n >= sizeof(buf) - 1) n = sizeof(buf) - 2; /* truncated like NCCL's 1024-byte buffer */
  buf[n++] = '\n';
  fwrite(buf, 1, n, debugFile); /* one write per line: concurrent processes never split a line */
  fflush(debugFile);
  pthread_mutex_unlock(&debugLock);
}
