/* json.c - bounded JSON line building, the watched variable set, and the environment snapshot.
 * No allocation: every line is built in the caller's stack buffer. */
#include <stdio.h>
#include <string.h>

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

/* Each environ entry is read once, into a local: a host thread's unsetenv() shifts the entries
 * down meanwhile (glibc moves them one by one, the last becoming NULL), so a second read of the
 * same slot can be NULL or another variable. glibc never frees a string setenv() made, so the one
 * read stays readable. What stays the host's race, as for its own getenv(): setenv() may move the
 * array itself (realloc) under the walk. (A racing host is undefined behaviour already; the probe
 * must not turn it into a certain crash.) */
static const char* env_entry(char** env, size_t i) { return __atomic_load_n(&env[i], __ATOMIC_RELAXED); }

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
  char** env = __atomic_load_n(&environ, __ATOMIC_ACQUIRE);
  const char* s;
  for (size_t i = 0; env && !jb->full && (s = env_entry(env, i)) != NULL; i++) {
    const char* eq = strchr(s, '=');
    if (!eq || !np_watched(s, (size_t)(eq - s))) continue;
    size_t before = jb->len;
    if (!env_member(jb, s, eq, first)) { /* drop this variable, keep the ones before and after it, and say so */
      jb->len = before;
      jb->full = 0;
      jb->truncated = 1;
      continue;
    }
    first = 0;
  }
  put(jb, '}');
  np_jb_settle(jb, mark);
  jb->cap = cap;
}
