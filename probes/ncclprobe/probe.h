/* probe.h - private interface between the parts of libncclprobe.so (log writer, preload hooks,
 * profiler plugin, env plugin). Nothing here is exported: the build uses -fvisibility=hidden and
 * only symbols marked NP_EXPORT leave the library. */
#ifndef NCCLPROBE_PROBE_H
#define NCCLPROBE_PROBE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../include/nccl_abi.h"

#define NP_EXPORT __attribute__((visibility("default")))

/* Probe ABI version: ncclprobe/probelib.py refuses a library whose version differs. */
#define NCCLPROBE_ABI "1"
#define NP_INIT_PIDNS "pid:[4026531836]" /* the initial pid namespace (PROC_PID_INIT_INO) */

enum { NP_ROLE_PRELOAD = 1, NP_ROLE_PROFILER = 2, NP_ROLE_ENVPLUGIN = 4 };

/* ---------------------------------------------------------------- JSON line builder (json.c)
 * Lines are built in a caller-owned (stack) buffer and written with one write(). A member that
 * does not fit is left out whole and flags `truncated`; the last NP_JB_TAIL bytes stay reserved
 * for `,"truncated":true}` and the newline, so every line is a complete object. */
#define NP_JB_TAIL 24
#define NP_VALUE_MAX 2048 /* a longer string value is cut (the cut is marked by `"truncated":true`) */
#define NP_NAME_MAX 256   /* a longer variable name in "env" is cut, marked the same way */

typedef struct {
  char* buf;
  size_t cap;
  size_t len;
  int full;        /* an append did not fit */
  int truncated;   /* a string value was cut at NP_VALUE_MAX */
  const char* src; /* the event's src (np_event_begin), a string literal */
} np_jb;

void np_jb_init(np_jb* jb, char* buf, size_t cap);
void np_jb_raw(np_jb* jb, const char* s, size_t n);
void np_jb_key(np_jb* jb, const char* key); /* ,"key": */
/* For a member built from several appends: if any did not fit, cut the line back to `mark` (the
 * length before the member) and flag it truncated, so the object stays valid JSON. */
void np_jb_settle(np_jb* jb, size_t mark);
void np_jb_str(np_jb* jb, const char* key, const char* val); /* null when val is NULL */
void np_jb_strn(np_jb* jb, const char* key, const char* val, size_t n);
void np_jb_int(np_jb* jb, const char* key, long long v);
void np_jb_uint(np_jb* jb, const char* key, unsigned long long v);
/* A 64-bit id (commHash, the uid hash, a communicator pointer) has one spelling in every witness
 * and in the reader (ncclprobe.model.comm_id): "0x" and 16 lowercase hex digits, so that ids with
 * leading zeros still compare equal as strings. */
#define NP_ID_CHARS 19 /* "0x", 16 digits, NUL */
void np_id_text(char out[NP_ID_CHARS], uint64_t v);
void np_jb_id(np_jb* jb, const char* key, uint64_t v);
void np_jb_ptr(np_jb* jb, const char* key, const void* p); /* an id, or null */
void np_jb_hex(np_jb* jb, const char* key, unsigned long long v); /* a value, not an id (a config's magic) */
void np_jb_dbl(np_jb* jb, const char* key, double v, int decimals);
void np_jb_bool(np_jb* jb, const char* key, int v);
void np_jb_null(np_jb* jb, const char* key);
/* Escaped string body (no quotes) of n bytes: control characters as \u00XX, bytes that are not
 * valid UTF-8 as \udcXX (Python's surrogateescape, so os.fsencode() gives the bytes back). */
void np_jb_escape(np_jb* jb, const char* s, size_t n);
size_t np_json_escape(const char* in, size_t n, char* out, size_t cap);

/* ---------------------------------------------------------------- watched set and environment */
int np_watched(const char* name, size_t n);
/* ,"env":{...} with every watched variable of the live environ, leaving NP_ENV_RESERVE bytes of
 * the line for the members that follow it. A variable that does not fit is left out whole and
 * the ones after it are still tried; names past NP_NAME_MAX and values past NP_VALUE_MAX bytes
 * are cut; any of these marks the line `"truncated":true`. */
#define NP_ENV_RESERVE 3072
void np_jb_env(np_jb* jb);
/* The probe's own reads of its settings (NCCLPROBE_*), in place of getenv(): the same walk as np_jb_env's,
 * which a host thread's racing setenv()/unsetenv() cannot crash (glibc's getenv can: a probe must not add such
 * a read to a host that races its environment). The value of name into out (cap bytes, NUL-terminated):
 * its length; cap where it is longer (out holds its start); -1 where name is unset or not readable. */
ssize_t np_env_value(const char* name, char* out, size_t cap);

/* ---------------------------------------------------------------- events (writer.c)
 * Host threads build a line and queue it; one writer thread per process writes it (writer.c says
 * why: a stalled filesystem must never block the host). */
#define NP_LINE_MAX 16384    /* the largest line buffer of any event, and of the queue's entries */
#define NP_DROPPED_ROOM 32   /* kept free in every line for the writer's ,"dropped":K */
int np_log_enabled(void); /* NCCLPROBE_DIR set and the file usable (asks the writer to open it on first use) */
int np_log_active(void);  /* the same without asking anything or waiting (the profiler's periodic paths) */
/* Starts a line: {"ev":..,"t":..,"pid":..,"src":..,"host":.. (at most NCCLPROBE_MAX_LINE long) */
void np_event_begin(np_jb* jb, const char* ev, const char* src);
/* Closes the object and queues the line; waits (bounded) until it is written, unless np_tl_nowait. */
void np_event_end(np_jb* jb);
void np_event_queue(np_jb* jb); /* the same, never waiting */
/* Closes the object (adds the newline); its length, 0 if the line could not be started. */
size_t np_event_finish(np_jb* jb);
/* Set on threads (and around calls) that must never wait for the writer: the collective path, the
 * profiler's flusher, the writer itself. */
extern __thread int np_tl_nowait;
/* probe_error event: `part` is what went silent (at most once per `once` flag, which the caller
 * owns). */
void np_probe_error(const char* src, const char* part, int* once, const char* message);
uint64_t np_now_ns(void); /* CLOCK_MONOTONIC */

/* ---------------------------------------------------------------- the log file (log.c)
 * The writer thread's side: nothing here is called by a host thread but np_log_setup. */
enum { NP_FILE_OK = 0, NP_FILE_LOST, NP_FILE_REFUSED, NP_FILE_FILES, NP_FILE_BYTES };
extern size_t np_line_cap; /* NCCLPROBE_MAX_LINE - NP_DROPPED_ROOM */
extern char np_hostq[600]; /* the host name, JSON-escaped */
void np_log_setup(void);   /* the NCCLPROBE_MAX_* knobs and the host name, once per process */
/* Opens this process's file in the kept directory, else in `dir` (NULL: none). NP_FILE_OK, LOST
 * (no directory), REFUSED (warned once: silent for good) or FILES (past the file budget). */
int np_file_open(const char* dir);
int np_file_refuse(const char* dir, const char* why); /* warns once, NP_FILE_REFUSED */
int np_file_has_dir(void);
/* Writes one line of n bytes (line[-1] and NP_DROPPED_ROOM bytes after it are the caller's to
 * lend), after checking the descriptor; *dropped is said in it and reset, or added to. */
int np_file_write(char* line, size_t n, const char* src, unsigned long long* dropped);
void np_file_close(void);
void np_file_forget_in_child(void); /* async-signal-safe */
/* A fork or vfork child's line, written by itself into its own file (async-signal-safe; spawn.c). */
int np_file_child_write(const char* line, size_t n);
int np_writer_running(void); /* this process has its writer thread (writer.c) */

/* ---------------------------------------------------------------- loaded NCCL libraries (libs.c) */
typedef struct {
  void* base;       /* load address (dli_fbase), the key */
  void* handle;     /* dlopen(path, RTLD_NOLOAD) handle, kept */
  char path[512];
  int version;      /* ncclGetVersion, 0 if unknown */
  int simulated;    /* the library exports ncclSimulated */
  int profiler_seen;
  int envplugin_seen;
  int ready;        /* handle, version and simulated are filled (libs.c) */
} np_lib;

/* The library containing address `addr` (e.g. a return address or a resolved function), added to
 * a fixed table on first sight; NULL when it is not a loaded object or the table is full. The
 * entry returned is filled (handle, version, simulated). */
np_lib* np_lib_of(const void* addr);
/* A symbol that the library itself defines (not one of its dependencies), or NULL. */
void* np_lib_sym(np_lib* lib, const char* name);
/* Base address of libncclprobe.so itself. */
void* np_self_base(void);
uint64_t np_fnv1a(const void* data, size_t n, uint64_t h);
#define NP_FNV_OFFSET 0xcbf29ce484222325ull

/* ---------------------------------------------------------------- fork safety (writer.c)
 * Every lock of the probe but the queue's, so that one pthread_atfork handler takes them all in
 * one order before fork() and releases them after it in parent and child: a child never inherits
 * a lock held by a thread it does not have (its exit flush would wait forever). Order: registry,
 * resolve cache, libraries, seen-table; the queue's lock comes after all of them and is re-created
 * in the child instead. None of them is ever held across I/O, a wait, a dlopen or a foreign
 * function. */
#include <pthread.h>
extern pthread_mutex_t np_reg_lock;   /* profiler.c */
extern pthread_mutex_t np_cache_lock; /* preload.c */
extern pthread_mutex_t np_libs_lock;  /* libs.c */
extern pthread_mutex_t np_seen_lock;  /* envplugin.c */

/* Call id of the preload hook running on this thread (0: none), so the profiler init that NCCL
 * runs inside the real call can name it. */
extern __thread uint64_t np_tl_call;

#endif /* NCCLPROBE_PROBE_H */
