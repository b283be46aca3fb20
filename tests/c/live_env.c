/* live_env.c - a C process whose environment tests/test_live_env.py reads from its memory while it
 * runs. It changes its environment the ways C code does, one command per stdin line, and answers
 * each with one stdout line ("ok ...") once the change is made, so the test never waits on time:
 *   set NAME VALUE     setenv(NAME, VALUE, 1)
 *   put NAME=VALUE     putenv of a heap copy (the string itself becomes the environment's)
 *   unset NAME         unsetenv(NAME)
 *   many N             N setenv of new names NCCL_MANY_<i> (glibc moves the array to the heap, then
 *                      reallocates it as it grows)
 *   replace N=V ...    environ = a new array of these strings (direct replacement)
 *   clear              clearenv() (environ becomes NULL)
 *   stress SPIN [EVERY PAUSE_US]
 *                      a thread that loops: setenv NCCL_STRESS_A=i then NCCL_STRESS_B=i, every 16th
 *                      iteration a new name NCCL_STRESS_N<i%64> set or unset, then SPIN ns of busy wait;
 *                      every EVERY iterations it sleeps PAUSE_US (a writer that never pauses changes
 *                      the array faster than any two reads of it can agree)
 *   count              the stress thread's iterations so far ("ok <n>")
 *   undump             prctl(PR_SET_DUMPABLE, 0): /proc/<pid>/mem and environ become root's
 *   exit               exit(0)
 * Built with -DDIRECT, it names `environ` itself (the executable then defines it: a copy
 * relocation); without, it reaches the C library's through dlsym (no copy in the executable). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#ifdef DIRECT
extern char **environ;
static char ***environ_slot(void) { return &environ; }
#else
static char ***environ_slot(void) { return (char ***)dlsym(RTLD_DEFAULT, "environ"); }
#endif

static atomic_long iterations;
static long spin_ns, pause_every, pause_us;

static void spin(long ns) {
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  do {
    clock_gettime(CLOCK_MONOTONIC, &b);
  } while ((b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec) < ns);
}

static void *stress(void *arg) {
  char value[32], name[32];
  for (long i = 1;; i++) {
    snprintf(value, sizeof value, "%ld", i);
    setenv("NCCL_STRESS_A", value, 1);
    setenv("NCCL_STRESS_B", value, 1);
    if (i % 16 == 0) {
      snprintf(name, sizeof name, "NCCL_STRESS_N%ld", i % 64);
      if (i % 32 == 0)
        unsetenv(name);
      else
        setenv(name, value, 1);
    }
    atomic_store(&iterations, i);
    if (spin_ns)
      spin(spin_ns);
    if (pause_every && i % pause_every == 0)
      usleep((useconds_t)pause_us);
  }
  return arg;
}

int main(void) {
  char line[1 << 16];
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("ready %d\n", getpid());
  while (fgets(line, sizeof line, stdin)) {
    line[strcspn(line, "\n")] = 0;
    char *cmd = strtok(line, " "), *a = strtok(NULL, " "), *b = strtok(NULL, "");
    if (!cmd) {
      printf("error empty\n");
    } else if (!strcmp(cmd, "set") && a && b) {
      setenv(a, b, 1);
      printf("ok\n");
    } else if (!strcmp(cmd, "put") && a) {
      putenv(strdup(a));
      printf("ok\n");
    } else if (!strcmp(cmd, "unset") && a) {
      unsetenv(a);
      printf("ok\n");
    } else if (!strcmp(cmd, "many") && a) {
      char name[64];
      for (long i = 0, n = atol(a); i < n; i++) {
        snprintf(name, sizeof name, "NCCL_MANY_%ld", i);
        setenv(name, "x", 1);
      }
      printf("ok\n");
    } else if (!strcmp(cmd, "replace")) {
      char *words = b ? b : "", *copy = NULL;
      if (a && asprintf(&copy, "%s %s", a, words) < 0)
        return 1;
      char **array = calloc(256, sizeof *array);
      int n = 0;
      for (char *w = copy ? strtok(copy, " ") : NULL; w && n < 255; w = strtok(NULL, " "))
        array[n++] = w;
      *environ_slot() = array;
      printf("ok\n");
    } else if (!strcmp(cmd, "clear")) {
      clearenv();
      printf("ok\n");
    } else if (!strcmp(cmd, "stress") && a) {
      pthread_t t;
      char* rest = b;
      spin_ns = atol(a);
      pause_every = rest ? strtol(rest, &rest, 10) : 0;
      pause_us = rest ? strtol(rest, &rest, 10) : 0;
      pthread_create(&t, NULL, stress, NULL);
      while (!atomic_load(&iterations))
        ;
      printf("ok\n");
    } else if (!strcmp(cmd, "count")) {
      printf("ok %ld\n", atomic_load(&iterations));
    } else if (!strcmp(cmd, "undump")) {
      prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
      printf("ok\n");
    } else if (!strcmp(cmd, "exit")) {
      return 0;
    } else {
      printf("error %s\n", cmd);
    }
  }
  return 0;
}
