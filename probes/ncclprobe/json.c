/* json.c - bounded JSON line building, the watched variable set, and the environment snapshot.
 * No allocation: every line is built in the caller's stack buffer. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "probe.h"

extern char** environ;

void np_jb_init(np_jb* jb, char* buf, size_t cap) {
  jb->buf = buf;
  jb->cap = cap;
  jb->len = 0;
  jb->full = 0;
  jb->truncated = 0;
}

/* Written so that no sum can wrap: n may come from an unchecked length. */
static int room(np_jb* jb, size_t n) {
  return jb->cap >= NP_JB_TAIL && jb->len <= jb->cap - NP_JB_TAIL && n <= jb->cap - NP_JB_TAIL - jb->len;
}

void np_jb_raw(np_jb* jb, const char* s, size_t n) {
  if (jb->full || !room(jb, n)) {
    jb->full = 1;
    return;
  }
  memcpy(jb->buf + jb->len, s, n);
  jb->len += n;
}

static void put(np_jb* jb, char c) {
  if (jb->full || !room(jb, 1)) {
    jb->full = 1;
    return;
  }
  jb->buf[jb->len++] = c;
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when s[0] starts no valid sequence. */
static size_t utf8_len(const unsigned char* s, size_t n) {
  unsigned char c = s[0];
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) need = 1;
  else if (c == 0xE0) { need = 2; lo = 0xA0; }
  else if (c == 0xED) { need = 2; hi = 0x9F; } /* no UTF-16 surrogates */
  else if (c >= 0xE1 && c <= 0xEF) need = 2;
  else if (c == 0xF0) { need = 3; lo = 0x90; }
  else if (c == 0xF4) { need = 3; hi = 0x8F; }
  else if (c >= 0xF1 && c <= 0xF3) need = 3;
  else return 0;
  if (n < need + 1) return 0;
  if (s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i <= need; i++)
    if (s[i] < 0x80 || s[i] > 0xBF) return 0;
  return need + 1;
}

void np_jb_escape(np_jb* jb, const char* str, size_t n) {
  static const char hex[] = "0123456789abcdef";
  const unsigned char* s = (const unsigned char*)str;
  size_t i = 0;
  while (i < n && !jb->full) {
    unsigned char c = s[i];
    if (c == '"' || c == '\\') {
      char e[2] = {'\\', (char)c};
      np_jb_raw(jb, e, 2);
      i++;
    } else if (c < 0x20 || c == 0x7f) {
      char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
      if (c == '\n') np_jb_raw(jb, "\\n", 2);
      else if (c == '\t') np_jb_raw(jb, "\\t", 2);
      else np_jb_raw(jb, e, 6);
      i++;
    } else if (c < 0x80) {
      put(jb, (char)c);
      i++;
    } else {
      size_t l = utf8_len(s + i, n - i);
      if (l) {
        np_jb_raw(jb, str + i, l);
        i += l;
      } else {
        char e[6] = {'\\', 'u', 'd', 'c', hex[c >> 4], hex[c & 15]};
        np_jb_raw(jb, e, 6);
        i++;
      }
    }
  }
}

size_t np_json_escape(const char* in, size_t n, char* out, size_t cap) {
  np_jb jb;
  if (cap < NP_JB_TAIL + 1) return 0;
  np_jb_init(&jb, out, cap);
  np_jb_escape(&jb, in, n);
  out[jb.len] = 0;
  return jb.full ? 0 : jb.len;
}

void np_jb_settle(np_jb* jb, size_t mark) {
  if (!jb->full) return;
  jb->len = mark;
  jb->full = 0;
  jb->truncated = 1;
}

void np_jb_key(np_jb* jb, const char* key) {
  /* The first member of an object (nested ones included) takes no comma. */
  if (jb->len && jb->buf[jb->len - 1] != '{') put(jb, ',');
  put(jb, '"');
  np_jb_raw(jb, key, strlen(key));
  np_jb_raw(jb, "\":", 2);
}

/* A member is either written whole or not at all: on overflow the line is rolled back to before
 * its key (the line then says "truncated":true), so the object stays valid JSON. Inside a compound
 * member whose own framing already failed (full on entry), nothing is written and `full` stays
 * set for that member's np_jb_settle. */
#define MEMBER(jb, key, body)         \
  do {                                \
    if ((jb)->full) break;            \
    size_t mark_ = (jb)->len;         \
    np_jb_key((jb), (key));           \
    body;                             \
    np_jb_settle((jb), mark_);        \
  } while (0)

void np_jb_strn(np_jb* jb, const char* key, const char* val, size_t n) {
  if (!val) {
    np_jb_null(jb, key);
    return;
  }
  if (n > NP_VALUE_MAX) {
    n = NP_VALUE_MAX;
    jb->truncated = 1;
  }
  MEMBER(jb, key, {
    put(jb, '"');
    np_jb_escape(jb, val, n);
    put(jb, '"');
  });
}

void np_jb_str(np_jb* jb, const char* key, const char* val) {
  np_jb_strn(jb, key, val, val ? strnlen(val, NP_VALUE_MAX + 1) : 0);
}

static void fmt_member(np_jb* jb, const char* key, const char* text) {
  MEMBER(jb, key, np_jb_raw(jb, text, strlen(text)));
}

void np_jb_int(np_jb* jb, const char* key, long long v) {
  char t[32];
  snprintf(t, sizeof t, "%lld", v);
  fmt_member(jb, key, t);
}

void np_jb_uint(np_jb* jb, const char* key, unsigned long long v) {
  char t[32];
  snprintf(t, sizeof t, "%llu", v);
  fmt_member(jb, key, t);
}

void np_jb_hex(np_jb* jb, const char* key, unsigned long long v) {
  char t[32];
  snprintf(t, sizeof t, "\"0x%llx\"", v);
  fmt_member(jb, key, t);
}

void np_id_text(char out[NP_ID_CHARS], uint64_t v) {
  snprintf(out, NP_ID_CHARS, "0x%016llx", (unsigned long long)v);
}

void np_jb_id(np_jb* jb, const char* key, uint64_t v) {
  char id[NP_ID_CHARS], t[NP_ID_CHARS + 2];
  np_id_text(id, v);
  snprintf(t, sizeof t, "\"%s\"", id);
  fmt_member(jb, key, t);
}

void np_jb_ptr(np_jb* jb, const char* key, const void* p) {
  if (!p) np_jb_null(jb, key);
  else np_jb_id(jb, key, (uint64_t)(uintptr_t)p);
}

void np_jb_dbl(np_jb* jb, const char* key, double v, int decimals) {
  char t[48];
  snprintf(t, sizeof t, "%.*f", decimals, v);
  fmt_member(jb, key, t);
}

void np_jb_bool(np_jb* jb, const char* key, int v) { fmt_member(jb, key, v ? "true" : "false"); }

void np_jb_null(np_jb* jb, const char* key) { fmt_member(jb, key, "null"); }

/* The watched set of ncclprobe/watched.py (DESIGN.md §4); nothing else is ever logged. */
int np_watched(const char* name, size_t n) {
  static const char* const prefixes[] = {"NCCL_", "TORCH_NCCL_", "NCCLPROBE_"};
  static const char* const names[] = {"TORCH_DISTRIBUTED_DEBUG", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD",
                                      "PYTHONPATH", "SGLANG_NCCL_SO_PATH", "VLLM_NCCL_SO_PATH"};
  for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
    size_t l = strlen(prefixes[i]);
    if (n >= l && memcmp(name, prefixes[i], l) == 0) return 1;
  }
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strlen(names[i]) == n && memcmp(name, names[i], n) == 0) return 1;
  return 0;
}

/* The walk of environ races the host's own setenv()/unsetenv() in other threads (a racing host is
 * undefined behaviour already, as for its own getenv(); the probe must not turn it into a crash):
 *  - unsetenv() shifts the entries down one by one (the last becoming NULL): each entry is read once,
 *    into a local, never a slot twice;
 *  - setenv() may move the array (realloc frees the old one, then environ names the new): a batch of
 *    entries is used only if environ still names its array after the batch was read, else the walk
 *    starts again on the new array (NP_ENV_WALKS times at most; then what was read is kept and the
 *    record says "truncated");
 *  - between that free and the new environ, a slot read may be freed memory, which malloc reuses at
 *    once (its first words: a mangled pointer, a random key), so a pointer read from it is any value:
 *    the array and the strings are read through process_vm_readv on this process, which gives a short
 *    count for memory that is not mapped instead of SIGSEGV (one call for a batch of pointers, one for
 *    their strings' first bytes, most watched values whole). glibc never frees a string setenv() made.
 * Where process_vm_readv is refused (seccomp, an old kernel) the reads are plain ones, and that last
 * window (a few stores inside setenv) stays the host's race. */
#define NP_ENV_WALKS 8
#define NP_ENV_BATCH 64 /* entries read per call */
#define NP_ENV_HEAD 96  /* bytes of an entry read first: whether it is watched (the longest watched name and '='
                         * are 24), and most watched ones whole (a longer one is read again, whole) */
#define NP_ENTRY_MAX (NP_NAME_MAX + 1 + NP_VALUE_MAX)

static int np_vmread = 1; /* process_vm_readv works here (0 once refused) */

/* Bytes from p to the end of its page (4 KiB: a multiple divides every page size): a remote range
 * within one page is readable whole or not at all. */
static size_t page_room(const void* p) { return 4096 - ((uintptr_t)p & 4095); }

/* n iovec pairs read with process_vm_readv; returns the bytes read (a short count stops at the first
 * range that is not mapped), or -1 where the call itself is refused (then np_vmread is 0). */
static ssize_t vm_read(pid_t pid, struct iovec* loc, struct iovec* rem, size_t n) {
  ssize_t r = process_vm_readv(pid, loc, n, rem, n, 0);
  if (r < 0 && errno != EFAULT && errno != ESRCH) {
    __atomic_store_n(&np_vmread, 0, __ATOMIC_RELAXED);
    return -1;
  }
  return r < 0 ? 0 : r;
}

/* n bytes at s (within one page) into buf: n, or 0 where that page is not readable. */
static size_t read_chunk(pid_t pid, const char* s, char* buf, size_t n) {
  if (np_vmread) {
    struct iovec loc = {buf, n}, rem = {(void*)s, n};
    ssize_t r = vm_read(pid, &loc, &rem, 1);
    if (r >= 0) return (size_t)r == n ? n : 0;
  }
  memcpy(buf, s, n); /* refused (np_vmread is 0 now): plainly */
  return n;
}

/* The entry at s as "name=value" in entry (the name cut at NP_NAME_MAX, the value at NP_VALUE_MAX;
 * *cut says so), NUL-terminated, read a page at a time, NP_ENTRY_SCAN bytes of it at most. Returns the
 * name's length (entry[it] is '='), or -1: no '=' there (or not readable). */
#define NP_ENTRY_SCAN (1u << 20)
static ssize_t read_entry(pid_t pid, const char* s, char* entry, int* cut) {
  char page[4096];
  size_t off = 0, out = 0, value = 0;
  ssize_t name = -1;
  *cut = 0;
  while (off < NP_ENTRY_SCAN) {
    size_t got = read_chunk(pid, s + off, page, page_room(s + off));
    for (size_t j = 0; j < got; j++) {
      char c = page[j];
      if (c == 0) goto done;
      if (name < 0 && c == '=') {
        name = (ssize_t)out;
        entry[out++] = '=';
      } else if (name < 0 ? out < NP_NAME_MAX : value < NP_VALUE_MAX) {
        entry[out++] = c;
        value += name >= 0;
      } else {
        *cut = 1;
        if (name >= 0) goto done; /* the rest of the value is not wanted */
      }
    }
    if (!got) break;
    off += got;
  }
  *cut = 1; /* not read to its end */
done:
  entry[out] = 0;
  return name;
}

/* Up to NP_ENV_BATCH entries of env from i on, read once: into ptrs, and the first bytes of each
 * (to the end of its page, NP_ENV_HEAD at most) into heads (hlen[k] bytes; 0: not readable).
 * Returns how many entries were read; *end is set where the array's NULL was among them. */
static size_t read_batch(pid_t pid, char** env, size_t i, const char** ptrs, char heads[][NP_ENV_HEAD],
                         size_t* hlen, int* end) {
  size_t n = NP_ENV_BATCH;
  /* The pointers too through process_vm_readv: an array freed (or shrunk) under the walk may end where a
   * thread arena's mapped part ends, and reading on to its NULL would fault there. */
  if (np_vmread) { /* cut at the page end: the next page is read as a range of its own (a short count) */
    size_t bytes = n * sizeof *ptrs, first = page_room(env + i);
    if (first > bytes) first = bytes;
    struct iovec loc[2] = {{(void*)ptrs, first}, {(char*)ptrs + first, bytes - first}};
    struct iovec rem[2] = {{(void*)(env + i), first}, {(char*)(env + i) + first, bytes - first}};
    ssize_t r = vm_read(pid, loc, rem, bytes > first ? 2 : 1);
    if (r >= 0) n = (size_t)r / sizeof *ptrs; /* the readable part */
  }
  if (!np_vmread)
    for (size_t k = 0; k < n; k++)
      if ((ptrs[k] = __atomic_load_n(&env[i + k], __ATOMIC_ACQUIRE)) == NULL) {
        n = k + 1;
        break;
      }
  *end = 0;
  for (size_t k = 0; k < n; k++)
    if (!ptrs[k]) {
      *end = 1;
      n = k;
      break;
    }
  if (n == 0) *end = 1; /* nothing readable there: the walk ends */
  struct iovec loc[NP_ENV_BATCH], rem[NP_ENV_BATCH];
  for (size_t k = 0; k < n; k++) {
    size_t want = page_room(ptrs[k]);
    hlen[k] = want < NP_ENV_HEAD ? want : NP_ENV_HEAD;
    loc[k].iov_base = heads[k];
    loc[k].iov_len = hlen[k];
    rem[k].iov_base = (void*)ptrs[k];
    rem[k].iov_len = hlen[k];
  }
  for (size_t k = 0; k < n && np_vmread;) { /* a short count: that entry is not readable, on after it */
    ssize_t r = vm_read(pid, loc + k, rem + k, n - k);
    if (r < 0) break;
    size_t done = (size_t)r;
    while (k < n && done >= hlen[k]) done -= hlen[k++];
    if (k < n) hlen[k++] = 0;
  }
  if (!np_vmread)
    for (size_t k = 0; k < n; k++) { /* with its NUL where it ends within */
      size_t l = strnlen(ptrs[k], hlen[k]);
      memcpy(heads[k], ptrs[k], hlen[k] = l < hlen[k] ? l + 1 : l);
    }
  return n;
}

/* The bytes at s up to their NUL into buf (cap bytes at most, NUL-terminated), a page at a time: their
 * length, cap where no NUL came within cap bytes, or -1 where a page was not readable. */
static ssize_t read_span(pid_t pid, const char* s, char* buf, size_t cap) {
  size_t off = 0;
  while (off < cap) {
    size_t want = page_room(s + off);
    if (want > cap - off) want = cap - off;
    if (!read_chunk(pid, s + off, buf + off, want)) return -1;
    const char* nul = memchr(buf + off, 0, want);
    if (nul) return nul - buf;
    off += want;
  }
  buf[cap - 1] = 0;
  return (ssize_t)cap;
}

ssize_t np_env_value(const char* name, char* out, size_t cap) {
  size_t nl = strlen(name);
  if (!cap || nl + 1 >= NP_ENV_HEAD) return -1;
  pid_t pid = getpid();
  char** env = __atomic_load_n(&environ, __ATOMIC_ACQUIRE);
  const char* ptrs[NP_ENV_BATCH];
  char heads[NP_ENV_BATCH][NP_ENV_HEAD], whole[NP_ENV_HEAD];
  size_t hlen[NP_ENV_BATCH];
  for (size_t i = 0, walks = 1; env;) {
    int end;
    size_t n = read_batch(pid, env, i, ptrs, heads, hlen, &end);
    char** now = __atomic_load_n(&environ, __ATOMIC_ACQUIRE);
    if (now != env) { /* moved under the walk (np_jb_env says why): again on the new array */
      if (walks++ == NP_ENV_WALKS || !now) return -1;
      env = now;
      i = 0;
      continue;
    }
    for (size_t k = 0; k < n; k++) {
      size_t hl = hlen[k] < nl + 1 ? hlen[k] : nl + 1;
      if (!hl || memcmp(heads[k], name, hl < nl ? hl : nl) != 0) continue;
      const char* head = heads[k];
      if (hl < nl + 1) { /* its page ended within the name: the name read again, across the page */
        if (read_span(pid, ptrs[k], whole, nl + 2) < (ssize_t)nl + 1) continue;
        head = whole;
      }
      if (memcmp(head, name, nl) == 0 && head[nl] == '=') return read_span(pid, ptrs[k] + nl + 1, out, cap);
    }
    if (end) break;
    i += n;
  }
  return -1;
}

/* Whether the entry whose first hl bytes are head may be watched: its name is, or more of it must be
 * read to know (the page ended before the '=' within the longest watched name). */
static int maybe_watched(const char* head, size_t hl) {
  const char* eq = memchr(head, '=', hl);
  if (eq) return np_watched(head, (size_t)(eq - head));
  const char* nul = memchr(head, 0, hl);
  if (nul) return 0; /* no '=': not a variable */
  return hl < NP_ENV_HEAD || np_watched(head, hl); /* a prefix matches whatever follows */
}

/* One "name":"value" member from the entry s (whose '=' is at eq); 0 if it does not fit. */
static int env_member(np_jb* jb, const char* s, const char* eq, int first) {
  size_t nlen = (size_t)(eq - s);
  if (nlen > NP_NAME_MAX) {
    nlen = NP_NAME_MAX;
    jb->truncated = 1;
  }
  if (!first) put(jb, ',');
  put(jb, '"');
  np_jb_escape(jb, s, nlen);
  np_jb_raw(jb, "\":\"", 3);
  size_t vlen = strnlen(eq + 1, NP_VALUE_MAX + 1);
  if (vlen > NP_VALUE_MAX) {
    vlen = NP_VALUE_MAX;
    jb->truncated = 1;
  }
  np_jb_escape(jb, eq + 1, vlen);
  put(jb, '"');
  return !jb->full;
}

void np_jb_env(np_jb* jb) {
  /* Leave room for the members written after the environment (rc, lib path, comm, ...): a quarter
   * of a short line (NCCLPROBE_MAX_LINE), NP_ENV_RESERVE of a long one. */
  if (jb->full) return;
  size_t cap = jb->cap, reserve = cap / 4 < NP_ENV_RESERVE ? cap / 4 : NP_ENV_RESERVE;
  jb->cap = cap - reserve;
  size_t mark = jb->len;
  np_jb_key(jb, "env");
  put(jb, '{');
  int first = 1;
  size_t open = jb->len;
  pid_t pid = getpid();
  char** env = __atomic_load_n(&environ, __ATOMIC_ACQUIRE);
  const char* ptrs[NP_ENV_BATCH];
  char heads[NP_ENV_BATCH][NP_ENV_HEAD];
  size_t hlen[NP_ENV_BATCH];
  char entry[NP_ENTRY_MAX + 1];
  for (size_t i = 0, walks = 1; env && !jb->full;) {
    int end;
    size_t n = read_batch(pid, env, i, ptrs, heads, hlen, &end);
    char** now = __atomic_load_n(&environ, __ATOMIC_ACQUIRE);
    if (now != env) { /* the array moved under the walk: what was read of it may be freed memory */
      if (walks++ == NP_ENV_WALKS || !now) {
        jb->truncated = 1;
        break;
      }
      env = now;
      jb->len = open;
      first = 1;
      i = 0;
      continue;
    }
    for (size_t k = 0; k < n && !jb->full; k++) {
      if (!hlen[k] || !maybe_watched(heads[k], hlen[k])) continue;
      size_t len = strnlen(heads[k], hlen[k]);
      const char* eq;
      if (len < hlen[k]) { /* whole within its head (the common case: no more reading) */
        memcpy(entry, heads[k], len + 1);
        eq = memchr(entry, '=', len);
      } else {
        int cut;
        ssize_t at = read_entry(pid, ptrs[k], entry, &cut);
        eq = at < 0 ? NULL : entry + at;
        if (eq && cut) jb->truncated = 1;
      }
      if (!eq || !np_watched(entry, (size_t)(eq - entry))) continue;
      size_t before = jb->len;
      if (!env_member(jb, entry, eq, first)) { /* drop this variable, keep the ones before and after it, and say so */
        jb->len = before;
        jb->full = 0;
        jb->truncated = 1;
        continue;
      }
      first = 0;
    }
    if (end) break;
    i += n;
  }
  put(jb, '}');
  np_jb_settle(jb, mark);
  jb->cap = cap;
}
