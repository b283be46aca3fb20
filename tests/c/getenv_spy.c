/* getenv_spy.c - preloaded ahead of the probe: a getenv that counts the reads of the probe's own settings
 * (names starting NCCLPROBE_), and at exit writes "probe_getenv=N" to the file SPY_OUT names. The probe reads
 * its settings through its own environ walk, which a host thread's racing setenv()/unsetenv() cannot crash
 * (glibc's getenv can): N must stay 0 while the probe still honours every setting. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int g_probe_reads;

__attribute__((visibility("default"))) char* getenv(const char* name) {
  static char* (*real)(const char*);
  if (!real) real = (char* (*)(const char*))dlsym(RTLD_NEXT, "getenv");
  if (name && strncmp(name, "NCCLPROBE_", 10) == 0) __atomic_add_fetch(&g_probe_reads, 1, __ATOMIC_RELAXED);
  return real ? real(name) : NULL;
}

__attribute__((destructor)) static void report(void) {
  static char* (*real)(const char*);
  real = (char* (*)(const char*))dlsym(RTLD_NEXT, "getenv");
  const char* out = real ? real("SPY_OUT") : NULL;
  if (!out) return;
  int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return;
  char line[64];
  int n = snprintf(line, sizeof line, "probe_getenv=%d\n", __atomic_load_n(&g_probe_reads, __ATOMIC_RELAXED));
  if (write(fd, line, (size_t)n) != n) {
  }
  close(fd);
}
