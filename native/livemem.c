/* livemem.c - `inspect --live`'s read of a process's environment from its memory, in one ctypes call
 * per process: witnesses/livemem.py's read (the reference, and the fallback where this is not built)
 * without its Python costs, which on a tree of hundreds of small processes were most of the time.
 * Runs in the ncclprobe process only; never writes to, stops or signals the one it reads.
 *
 * The call reads <base>/maps (the readable mappings, the executable's and the C library's lowest
 * mapping), takes the environ slot of the first of those two objects that defines it from the table
 * Python keeps (it reads the ELF files; an object not in it is returned as LM_NEED, described in
 * info), then reads the slot, the NULL-terminated array and the strings through pread on <base>/mem:
 * every address inside one readable mapping, strings laid out together read in one window, every
 * byte used read again and compared (a torn snapshot is retried, never returned). It returns, in
 * array order, the watched NAME=VALUE strings and, for an expected name that is not watched, only
 * whether its value is the expected one: that value never leaves this function. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* limits, as livemem.py's */
#define LM_MAX_ENTRIES (1 << 16)
#define LM_MAX_BYTES (1 << 23)
#define LM_MAX_NAME (1 << 10)
#define LM_MAX_STRING (1 << 20)
#define LM_GAP (1 << 12)
#define LM_TAIL (1 << 9)
#define LM_MAX_MAPS (1 << 26) /* bytes of a maps file read at most */

/* returns (besides a count >= 0 and -errno) */
enum { LM_NEED = -1000, LM_NO_MEMORY = -1001, LM_NO_LIBC = -1002, LM_NO_SLOT = -1003, LM_TORN = -1004,
       LM_BOUNDED = -1005, LM_GONE = -1006, LM_BADMAPS = -1007, LM_BIGMAPS = -1008 };
enum { R_PREFIX = 1, R_NAME = 2, R_EXPECTED = 3 };              /* rule kinds */
enum { OUT_VALUE = 1, OUT_EQUAL = 2, OUT_DIFFERS = 3 };         /* record kinds */
/* info[]: why the call stopped before the last process (LM_NEED, -ENOBUFS, or 0), and for LM_NEED
 * the object to resolve: which (0 exe, 1 libc), static, start, offset, dev major, dev minor, inode,
 * and the length of its path (in need_path) */
enum { I_STOP, I_WHICH, I_STATIC, I_START, I_OFFSET, I_MAJOR, I_MINOR, I_INODE, I_PATH_LEN, I_COUNT };
/* status[] per process: its return (records, or a code), retries, bytes read, where its records are
 * in out, and for LM_NO_SLOT the table entries of the objects met (-1 for none) */
enum { ST_RC, ST_RETRIES, ST_BYTES, ST_OFF, ST_LEN, ST_NOSLOT0, ST_NOSLOT1, ST_COUNT };

/* An object whose slot Python has resolved: the key as maps shows it, for its lowest mapping. */
typedef struct {
  uint64_t inode, offset;
  uint32_t dev_major, dev_minor;
  int64_t delta; /* slot = the lowest mapping's start + delta; INT64_MIN: it defines no environ */
  int32_t word, is_static, path_off, path_len;
} lm_obj;

typedef struct { uint64_t start, offset, inode; uint32_t major, minor; const char* path; size_t path_len; } lm_row;

#define LM_FOUND 16
typedef struct {
  int fd;                 /* mem */
  int qfd;                /* maps, asked with PROCMAP_QUERY; -1: the ranges come from its text */
  const uint64_t* ranges; /* start, end pairs, sorted (from the text) */
  int64_t nranges, read;
  uint64_t found[LM_FOUND][2]; /* the usable mappings the queries met */
  int nfound;
} lm_mem;

/* PROCMAP_QUERY (Linux 6.11, include/uapi/linux/fs.h): one mapping per ioctl on an open maps file,
 * as procread.c asks it. It spares formatting every row of maps, most of that file's cost. */
struct lm_query {
  uint64_t size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
  uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
  uint64_t vma_name_addr, build_id_addr;
};
#define LM_PROCMAP_QUERY 0xC0686611 /* _IOWR('f', 17, struct procmap_query) */
enum { Q_READABLE = 1, Q_WRITABLE = 2, Q_EXECUTABLE = 4, Q_SHARED = 8, Q_COVERING_OR_NEXT = 0x10, Q_FILE_BACKED = 0x20 };
#define LM_QUERY_EXEC_MAX 64 /* executable mappings asked for the objects before reading maps instead */
static int lm_no_query; /* read maps even where PROCMAP_QUERY would do (ncclprobe_live_read_maps) */

typedef struct { uint64_t addr; char* data; int64_t len; } lm_win;
typedef struct { uint64_t addr; const char* orig; int64_t len; } lm_used;

/* A whole maps file, up to LM_MAX_MAPS bytes (LM_BIGMAPS past it: a process can make its maps as large
 * as it likes, with 65,530 mappings of files at paths of any length). */
static int64_t read_all(int dfd, const char* name, char** buf) {
  int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return -errno;
  size_t cap = 1 << 14, len = 0;
  char* b = malloc(cap);
  for (;;) {
    if (!b) { close(fd); return -ENOMEM; }
    if (len > LM_MAX_MAPS) { close(fd); free(b); return LM_BIGMAPS; }
    if (cap - len < 4096) { char* nb = realloc(b, cap *= 2); if (!nb) { free(b); b = NULL; continue; } b = nb; }
    ssize_t n = read(fd, b + len, cap - len);
    if (n < 0) { int e = errno; close(fd); free(b); return -e; }
    if (n == 0) break;
    len += (size_t)n;
  }
  close(fd);
  *buf = b;
  return (int64_t)len;
}

static int hexval(const char** p, const char* end, uint64_t* v) {
  const char* s = *p;
  uint64_t x = 0;
  while (s < end && ((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
    x = x * 16 + (uint64_t)(*s <= '9' ? *s - '0' : *s - 'a' + 10), s++;
  if (s == *p) return -1;
  *p = s, *v = x;
  return 0;
}

/* livemem.py _LIBC: libc.so[.N...], libc-X.Y.so, libc.musl-*.so.1, ld-musl-*.so.1 */
static int digits_dots(const char* s, size_t n) {
  for (size_t i = 0; i < n; i++) if (!((s[i] >= '0' && s[i] <= '9') || s[i] == '.')) return 0;
  return 1;
}
static int wordish(const char* s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '-')) return 0;
  }
  return n > 0;
}
static int is_libc(const char* name, size_t n) {
  if (n >= 7 && !memcmp(name, "libc.so", 7)) { /* (\.\d+)* */
    size_t i = 7;
    while (i < n) {
      if (name[i] != '.' || i + 1 >= n || name[i + 1] < '0' || name[i + 1] > '9') return 0;
      for (i++; i < n && name[i] >= '0' && name[i] <= '9'; i++) {}
    }
    return 1;
  }
  if (n > 8 && !memcmp(name, "libc-", 5) && !memcmp(name + n - 3, ".so", 3)) return digits_dots(name + 5, n - 8) && n - 8 > 0;
  if (n > 15 && !memcmp(name, "libc.musl-", 10) && !memcmp(name + n - 5, ".so.1", 5)) return wordish(name + 10, n - 15);
  if (n > 13 && !memcmp(name, "ld-musl-", 8) && !memcmp(name + n - 5, ".so.1", 5)) return wordish(name + 8, n - 13);
  return 0;
}

/* livemem.py _usable: readable, and no device (a GPU's BAR) or kernel page */
static int usable(const char* perms, const char* path, size_t n) {
  if (perms[0] != 'r') return 0;
  if (!n) return 1;
  if (path[0] == '[')
    return (n == 6 && !memcmp(path, "[heap]", 6)) || (n == 7 && !memcmp(path, "[stack]", 7)) ||
           (n > 6 && !memcmp(path, "[anon:", 6)) || (n > 7 && !memcmp(path, "[stack:", 7));
  if (n >= 5 && !memcmp(path, "/dev/", 5)) return (n >= 9 && !memcmp(path, "/dev/zero", 9)) || (n >= 9 && !memcmp(path, "/dev/shm/", 9));
  return 1;
}

/* The rows of maps: the usable ranges, and the lowest rows of the executable and of the C library. */
static int parse_maps(const char* b, int64_t len, const char* exe, uint64_t* ranges, int64_t* nranges,
                      lm_row* exe_row, lm_row* libc_row) {
  const char* p = b;
  const char* end = b + len;
  size_t exe_len = exe ? strlen(exe) : 0;
  *nranges = 0;
  while (p < end) {
    const char* eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol) eol = end;
    uint64_t start, stop, offset, major, minor, inode = 0;
    const char* q = p;
    if (hexval(&q, eol, &start) || q >= eol || *q++ != '-' || hexval(&q, eol, &stop) || eol - q < 6 || *q++ != ' ')
      return LM_BADMAPS;
    const char* perms = q;
    q += 4;
    if (q >= eol || *q++ != ' ' || hexval(&q, eol, &offset) || q >= eol || *q++ != ' ' || hexval(&q, eol, &major) ||
        q >= eol || *q++ != ':' || hexval(&q, eol, &minor) || q >= eol || *q++ != ' ')
      return LM_BADMAPS;
    while (q < eol && *q >= '0' && *q <= '9') inode = inode * 10 + (uint64_t)(*q++ - '0');
    while (q < eol && *q == ' ') q++;
    size_t n = (size_t)(eol - q);
    if (usable(perms, q, n)) {
      /* rows come sorted; maps read while the process maps or unmaps can repeat or skip rows across
       * the reads of one file (a seq_file restarts at the address it stopped at): read it again */
      if (*nranges && start < ranges[2 * *nranges - 1]) return LM_TORN;
      ranges[2 * *nranges] = start, ranges[2 * *nranges + 1] = stop, (*nranges)++;
    }
    if (inode && n && q[0] == '/') {
      lm_row r = {start, offset, inode, (uint32_t)major, (uint32_t)minor, q, n};
      if (!exe_row->path && exe && n == exe_len && !memcmp(q, exe, n)) *exe_row = r;
      if (!libc_row->path) {
        size_t m = n;
        if (m > 10 && !memcmp(q + m - 10, " (deleted)", 10)) m -= 10;
        const char* base = q + m;
        while (base > q && base[-1] != '/') base--;
        if (is_libc(base, (size_t)(q + m - base))) *libc_row = r;
      }
    }
    p = eol + 1;
  }
  return 0;
}

static int ask(int qfd, uint64_t addr, uint64_t flags, struct lm_query* q, char* name, size_t name_len) {
  memset(q, 0, sizeof *q);
  q->size = sizeof *q, q->query_flags = flags, q->query_addr = addr;
  q->vma_name_addr = (uint64_t)(uintptr_t)name, q->vma_name_size = (uint32_t)name_len;
  if (ioctl(qfd, LM_PROCMAP_QUERY, q) < 0) return -errno;
  if (!q->vma_name_size) name[0] = 0;
  return 0;
}

static const uint64_t* range_of(lm_mem* m, uint64_t addr) {
  if (m->qfd >= 0) {
    for (int i = 0; i < m->nfound; i++)
      if (m->found[i][0] <= addr && addr < m->found[i][1]) return m->found[i];
    struct lm_query q;
    char name[4200];
    if (ask(m->qfd, addr, 0, &q, name, sizeof name) < 0) return NULL; /* ENOENT: nothing mapped there */
    char perms[4] = {q.vma_flags & Q_READABLE ? 'r' : '-', 0, 0, 0};
    size_t n = q.vma_name_size ? strnlen(name, sizeof name) : 0;
    if (!usable(perms, name, n)) return NULL;
    int i = m->nfound < LM_FOUND ? m->nfound++ : (int)(addr / 4096 % LM_FOUND);
    m->found[i][0] = q.vma_start, m->found[i][1] = q.vma_end;
    return m->found[i];
  }
  int64_t lo = 0, hi = m->nranges;
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    if (m->ranges[2 * mid + 1] <= addr) lo = mid + 1;
    else hi = mid;
  }
  return lo < m->nranges && m->ranges[2 * lo] <= addr ? m->ranges + 2 * lo : NULL;
}

/* n bytes at addr, inside one usable mapping (exact: 1) or cut at its end (upto: 0); the length read,
 * or LM_TORN (outside, or unmapped since), LM_BOUNDED, LM_GONE. */
static int64_t mem_read(lm_mem* m, uint64_t addr, char* dst, int64_t n, int exact) {
  const uint64_t* r = range_of(m, addr);
  if (!r) return LM_TORN;
  if ((uint64_t)n > r[1] - addr) {
    if (exact) return LM_TORN;
    n = (int64_t)(r[1] - addr);
  }
  if (m->read + n > LM_MAX_BYTES) return LM_BOUNDED;
  ssize_t got = pread(m->fd, dst, (size_t)n, (off_t)addr);
  if (got < 0) return errno == EIO || errno == EFAULT ? LM_TORN : -errno;
  m->read += got;
  if (got == 0 && n) return LM_GONE;
  if (got != n) return LM_TORN;
  return got;
}

static int cmp_u64(const void* a, const void* b) {
  uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
  return x < y ? -1 : x > y;
}

static int cmp_used(const void* a, const void* b) {
  uint64_t x = ((const lm_used*)a)->addr, y = ((const lm_used*)b)->addr;
  return x < y ? -1 : x > y;
}

typedef struct {
  const char* rules;
  int64_t rules_len;
  char* out;
  int64_t out_len, used_out, count;
} lm_sink;

/* What the rules keep of NAME=VALUE (name_len bytes of name, then '='): 0 nothing, 1 its value, 2
 * the equality with an expected value (*exp, *exp_len). */
static int keep(const lm_sink* s, const char* name, int64_t name_len, const char** exp, int64_t* exp_len) {
  int expected = 0;
  for (const char* r = s->rules; r < s->rules + s->rules_len;) {
    int kind = r[0];
    uint32_t n, v = 0;
    memcpy(&n, r + 1, 4);
    const char* text = r + 5;
    if (kind == R_EXPECTED) memcpy(&v, text + n, 4);
    if (kind == R_PREFIX && name_len >= (int64_t)n && !memcmp(name, text, n)) return 1;
    if (kind == R_NAME && name_len == (int64_t)n && !memcmp(name, text, n)) return 1;
    if (kind == R_EXPECTED && !expected && name_len == (int64_t)n && !memcmp(name, text, n))
      expected = 1, *exp = text + n + 4, *exp_len = v;
    r = text + n + (kind == R_EXPECTED ? 4 + v : 0);
  }
  return expected ? 2 : 0;
}

static int emit(lm_sink* s, int kind, const char* name, int64_t name_len, const char* value, int64_t value_len) {
  int64_t need = 9 + name_len + value_len;
  if (s->used_out + need > s->out_len) return -ENOBUFS;
  char* o = s->out + s->used_out;
  uint32_t n = (uint32_t)name_len, v = (uint32_t)value_len;
  o[0] = (char)kind;
  memcpy(o + 1, &n, 4), memcpy(o + 5, &v, 4), memcpy(o + 9, name, n), memcpy(o + 9 + n, value, v);
  s->used_out += need, s->count++;
  return 0;
}

/* One attempt at a consistent snapshot: 0 with the records in s, or LM_TORN, LM_BOUNDED, ... */
static int64_t snapshot(lm_mem* m, uint64_t slot, int word, lm_sink* s) {
  int64_t rc = 0, nwin = 0, nused = 0, nptr = 0, cap_ptr = 0, nx = 0;
  char head[8] = {0}, again[8] = {0};
  uint64_t* ptrs = NULL;   /* the array as read */
  uint64_t* sorted = NULL;
  char* raw = NULL;        /* its bytes, the NULL included */
  lm_win* win = NULL;
  lm_used* used = NULL;
  char** extra = NULL;     /* strings read on their own */
  char* scratch = NULL;
  int64_t mark = s->used_out, count0 = s->count; /* this attempt's records start here */
  if ((rc = mem_read(m, slot, head, word, 1)) < 0) goto done;
  uint64_t ptr = 0;
  memcpy(&ptr, head, (size_t)word); /* little-endian host: the low bytes */
  if (!ptr) { /* clearenv(): no environment */
    if ((rc = mem_read(m, slot, again, word, 1)) < 0) goto done;
    rc = memcmp(head, again, (size_t)word) ? LM_TORN : 0;
    goto done;
  }
  /* the array, in chunks, up to its NULL */
  int64_t raw_len = 0, chunk = 4096, found = -1;
  while (found < 0) {
    char* nr = realloc(raw, (size_t)(raw_len + chunk));
    if (!nr) { rc = -ENOMEM; goto done; }
    raw = nr;
    int64_t got = mem_read(m, ptr + (uint64_t)raw_len, raw + raw_len, chunk, 0);
    if (got < 0) { rc = got; goto done; }
    got -= got % word;
    if (!got) { rc = LM_TORN; goto done; }
    for (int64_t i = raw_len; i < raw_len + got; i += word) {
      uint64_t v = 0;
      memcpy(&v, raw + i, (size_t)word);
      if (!v) { found = i; break; }
      if (nptr == cap_ptr) {
        uint64_t* np = realloc(ptrs, (size_t)(cap_ptr = cap_ptr ? cap_ptr * 2 : 256) * sizeof *ptrs);
        if (!np) { rc = -ENOMEM; goto done; }
        ptrs = np;
      }
      ptrs[nptr++] = v;
      if (nptr > LM_MAX_ENTRIES) { rc = LM_BOUNDED; goto done; }
    }
    raw_len += got;
    if (chunk < (1 << 18)) chunk *= 4;
  }
  raw_len = found + word;
  /* the windows: sorted distinct pointers, split at gaps of LM_GAP and at the ends of mappings */
  sorted = malloc((size_t)(nptr ? nptr : 1) * sizeof *sorted);
  win = malloc((size_t)(nptr ? nptr : 1) * sizeof *win);
  used = malloc((size_t)(nptr ? nptr : 1) * sizeof *used);
  extra = calloc((size_t)(nptr ? nptr : 1), sizeof *extra);
  if (!sorted || !win || !used || !extra) { rc = -ENOMEM; goto done; }
  memcpy(sorted, ptrs, (size_t)nptr * sizeof *sorted);
  qsort(sorted, (size_t)nptr, sizeof *sorted, cmp_u64);
  for (int64_t i = 0; i < nptr;) {
    const uint64_t* r = range_of(m, sorted[i]);
    if (!r) { rc = LM_TORN; goto done; }
    int64_t j = i;
    while (j + 1 < nptr && sorted[j + 1] < r[1] && sorted[j + 1] - sorted[j] < LM_GAP) j++;
    uint64_t lo = sorted[i], hi = sorted[j] + LM_TAIL < r[1] ? sorted[j] + LM_TAIL : r[1];
    win[nwin].addr = lo;
    win[nwin].data = malloc((size_t)(hi - lo));
    if (!win[nwin].data) { rc = -ENOMEM; goto done; }
    nwin++;
    if ((rc = mem_read(m, lo, win[nwin - 1].data, (int64_t)(hi - lo), 1)) < 0) goto done;
    win[nwin - 1].len = rc;
    for (i = j + 1; i < nptr && sorted[i] == sorted[j]; i++) {}
  }
  /* each string in array order: its name matched as bytes, its value kept, compared, or left */
  for (int64_t k = 0; k < nptr; k++) {
    uint64_t p = ptrs[k];
    int64_t lo = 0, hi = nwin;
    while (hi - lo > 1) { int64_t mid = (lo + hi) / 2; if (win[mid].addr <= p) lo = mid; else hi = mid; }
    const char* data = win[lo].data + (p - win[lo].addr);
    int64_t avail = win[lo].len - (int64_t)(p - win[lo].addr);
    const char* nul = memchr(data, 0, (size_t)avail);
    if (!nul) { /* the window ends inside this string: read it on its own */
      int64_t size = 4096;
      for (;;) {
        int64_t want = size < LM_MAX_STRING + 1 ? size : LM_MAX_STRING + 1;
        char* ns = realloc(scratch, (size_t)want);
        if (!ns) { rc = -ENOMEM; goto done; }
        scratch = ns;
        int64_t got = mem_read(m, p, scratch, want, 0);
        if (got < 0) { rc = got; goto done; }
        if ((nul = memchr(scratch, 0, (size_t)got))) { avail = got; break; }
        if (got < want) { rc = LM_TORN; goto done; }
        if (got > LM_MAX_STRING) { rc = LM_BOUNDED; goto done; }
        size *= 4;
      }
      extra[nx++] = scratch, data = scratch, scratch = NULL;
    }
    int64_t len = nul - data, name_len = -1;
    const char* eq = memchr(data, '=', (size_t)(len < LM_MAX_NAME + 1 ? len : LM_MAX_NAME + 1));
    if (!eq || eq == data) continue; /* no '=' (getenv skips it), an empty or overlong name */
    name_len = eq - data;
    const char* exp = NULL;
    int64_t exp_len = 0;
    int what = keep(s, data, name_len, &exp, &exp_len);
    if (!what) continue;
    used[nused].addr = p, used[nused].orig = data, used[nused].len = len + 1, nused++;
    if (what == 1) rc = emit(s, OUT_VALUE, data, name_len, eq + 1, len - name_len - 1);
    else {
      int same = len - name_len - 1 == exp_len && !memcmp(eq + 1, exp, (size_t)exp_len);
      rc = emit(s, same ? OUT_EQUAL : OUT_DIFFERS, data, name_len, "", 0); /* the value stays here */
    }
    if (rc < 0) goto done;
  }
  /* the same a second time: the slot, the array, every string used */
  if ((rc = mem_read(m, slot, again, word, 1)) < 0) goto done;
  if (memcmp(head, again, (size_t)word)) { rc = LM_TORN; goto done; }
  char* check = malloc((size_t)raw_len);
  if (!check) { rc = -ENOMEM; goto done; }
  rc = mem_read(m, ptr, check, raw_len, 1);
  int differs = rc >= 0 && memcmp(check, raw, (size_t)raw_len);
  free(check);
  if (rc < 0) goto done;
  if (differs) { rc = LM_TORN; goto done; }
  qsort(used, (size_t)nused, sizeof *used, cmp_used);
  for (int64_t i = 0; i < nused;) { /* strings less than LM_GAP apart in one mapping: one read */
    const uint64_t* r = range_of(m, used[i].addr);
    int64_t j = i;
    uint64_t end = used[i].addr + (uint64_t)used[i].len;
    while (j + 1 < nused && r && used[j + 1].addr < end + LM_GAP && used[j + 1].addr + (uint64_t)used[j + 1].len <= r[1]) {
      j++;
      if (used[j].addr + (uint64_t)used[j].len > end) end = used[j].addr + (uint64_t)used[j].len;
    }
    int64_t n = (int64_t)(end - used[i].addr);
    char small[4096];
    char* buf = n <= (int64_t)sizeof small ? small : malloc((size_t)n);
    if (!buf) { rc = -ENOMEM; goto done; }
    rc = mem_read(m, used[i].addr, buf, n, 1);
    differs = 0;
    for (int64_t k = i; rc >= 0 && k <= j && !differs; k++)
      differs = memcmp(buf + (used[k].addr - used[i].addr), used[k].orig, (size_t)used[k].len) != 0;
    if (buf != small) free(buf);
    if (rc < 0) goto done;
    if (differs) { rc = LM_TORN; goto done; }
    i = j + 1;
  }
  rc = 0;
done:
  if (rc < 0) s->used_out = mark, s->count = count0;
  for (int64_t i = 0; i < nwin; i++) free(win[i].data);
  for (int64_t i = 0; i < nx; i++) free(extra[i]);
  free(win), free(used), free(extra), free(sorted), free(ptrs), free(raw), free(scratch);
  return rc;
}

static void describe(int64_t* info, int which, int is_static, const lm_row* r, char* need_path, int64_t need_len) {
  info[I_WHICH] = which, info[I_STATIC] = is_static, info[I_START] = (int64_t)r->start;
  info[I_OFFSET] = (int64_t)r->offset, info[I_MAJOR] = r->major, info[I_MINOR] = r->minor;
  info[I_INODE] = (int64_t)r->inode;
  int64_t n = (int64_t)r->path_len < need_len ? (int64_t)r->path_len : need_len;
  memcpy(need_path, r->path, (size_t)n);
  info[I_PATH_LEN] = (int64_t)r->path_len; /* the whole length: over need_len, only a part was copied */
}

/* The environ slot of pid: LM_NEED (an object Python has not resolved, in info), LM_NO_SLOT (neither
 * defines environ), LM_NO_LIBC, or 0 with *slot and *word. */
static int64_t locate(const lm_row* exe, const lm_row* libc, const lm_obj* objs, int32_t nobjs,
                      const char* obj_paths, uint64_t* slot, int* word, int64_t* info, int64_t* st,
                      char* need_path, int64_t need_len) {
  const lm_row* order[2] = {exe->path ? exe : NULL, libc->path && (!exe->path || libc->start != exe->start) ? libc : NULL};
  int known[2] = {-1, -1}, nknown = 0;
  for (int w = 0; w < 2; w++) {
    const lm_row* r = order[w];
    if (!r) continue;
    int is_static = w == 0 && !libc->path;
    const lm_obj* hit = NULL;
    for (int32_t i = 0; i < nobjs && !hit; i++) {
      const lm_obj* o = objs + i;
      if (o->inode == r->inode && o->dev_major == r->major && o->dev_minor == r->minor && o->offset == r->offset &&
          o->is_static == is_static && (size_t)o->path_len == r->path_len && !memcmp(obj_paths + o->path_off, r->path, r->path_len))
        hit = o;
    }
    if (!hit) {
      describe(info, w, is_static, r, need_path, need_len);
      /* a path the caller's buffer cannot hold whole: ask for a larger one (a cut path would never
       * match this row again, and the caller would resolve it again, for ever) */
      if ((int64_t)r->path_len > need_len) return -ENAMETOOLONG;
      return LM_NEED;
    }
    if (hit->delta == INT64_MIN) {
      known[nknown++] = (int)(hit - objs);
      continue;
    }
    *slot = r->start + (uint64_t)hit->delta, *word = hit->word;
    return 0;
  }
  if (nknown) { /* the table entries, in order, whose reasons Python gives */
    st[ST_NOSLOT0] = known[0], st[ST_NOSLOT1] = known[1];
    return LM_NO_SLOT;
  }
  return LM_NO_LIBC;
}

/* The executable's and the C library's executable mappings, asked of the kernel (PROCMAP_QUERY); names
 * in the two buffers. 0, or -1 where maps must be read instead (no such ioctl, too many mappings). */
static int query_objects(int qfd, const char* exe, lm_row* exe_row, lm_row* libc_row, char* exe_name,
                         char* libc_name, size_t name_len) {
  size_t exe_len = exe ? strlen(exe) : 0;
  char name[4200];
  uint64_t addr = 0;
  for (int k = 0; k < LM_QUERY_EXEC_MAX; k++) {
    struct lm_query q;
    int rc = ask(qfd, addr, Q_COVERING_OR_NEXT | Q_FILE_BACKED | Q_EXECUTABLE, &q, name, sizeof name);
    if (rc == -ENOENT) return 0; /* no executable mapping after addr */
    if (rc < 0) return -1; /* ENOTTY: a kernel before 6.11 (or not procfs): maps is read instead */
    addr = q.vma_end;
    size_t n = q.vma_name_size ? strnlen(name, sizeof name) : 0;
    if (!q.inode || !n || name[0] != '/' || n >= name_len) continue;
    lm_row r = {q.vma_start, q.vma_offset, q.inode, q.dev_major, q.dev_minor, NULL, n};
    if (!exe_row->path && exe && n == exe_len && !memcmp(name, exe, n)) {
      memcpy(exe_name, name, n);
      *exe_row = r, exe_row->path = exe_name;
    }
    if (!libc_row->path) {
      size_t m = n;
      if (m > 10 && !memcmp(name + m - 10, " (deleted)", 10)) m -= 10;
      const char* base = name + m;
      while (base > name && base[-1] != '/') base--;
      if (is_libc(base, (size_t)(name + m - base))) {
        memcpy(libc_name, name, n);
        *libc_row = r, libc_row->path = libc_name;
      }
    }
    if (exe_row->path && libc_row->path) return 0;
  }
  return -1;
}

/* One process: its records appended to the sink, its status in st. */
static int64_t read_process(const char* base, const char* exe, const lm_obj* objs, int32_t nobjs,
                            const char* obj_paths, int32_t retries, lm_sink* sink, int64_t* st, int64_t* info,
                            char* need_path, int64_t need_len) {
  char exe_buf[4200];
  /* the directory once: a pid reused between two of the files cannot mix two processes */
  int dfd = open(base, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return -errno;
  int fd = openat(dfd, "mem", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    close(dfd);
    return -e;
  }
  if (!exe) { /* as livemem.py reads it: the link's target (it may end in " (deleted)") */
    ssize_t n = readlinkat(dfd, "exe", exe_buf, sizeof exe_buf - 1);
    if (n >= 0) exe_buf[n] = 0, exe = exe_buf;
  }
  int64_t rc = 0;
  uint64_t* ranges = NULL;
  char* maps = NULL;
  char exe_name[4200], libc_name[4200];
  int64_t count0 = sink->count;
  int qfd = lm_no_query ? -1 : openat(dfd, "maps", O_RDONLY | O_CLOEXEC);
  for (int attempt = 0;; attempt++) {
    lm_row exe_row = {0}, libc_row = {0};
    int64_t nranges = 0;
    lm_mem m = {fd, -1, NULL, 0, 0, {{0}}, 0};
    if (qfd >= 0 && !query_objects(qfd, exe, &exe_row, &libc_row, exe_name, libc_name, sizeof exe_name)) {
      if (!exe_row.path && !libc_row.path) {
        struct lm_query q;
        char name[8];
        /* nothing executable mapped: no mm at all (a zombie), or nothing of ours */
        rc = ask(qfd, 0, Q_COVERING_OR_NEXT, &q, name, sizeof name) == -ENOENT ? LM_NO_MEMORY : LM_NO_LIBC;
        break;
      }
      m.qfd = qfd;
    } else {
      memset(&exe_row, 0, sizeof exe_row), memset(&libc_row, 0, sizeof libc_row);
      free(maps), maps = NULL;
      int64_t len = read_all(dfd, "maps", &maps);
      if (len < 0) { rc = len; break; }
      if (len == 0) { rc = LM_NO_MEMORY; break; }
      int64_t rows = 1;
      for (const char* q = maps; (q = memchr(q, '\n', (size_t)(maps + len - q))); q++) rows++;
      free(ranges);
      if (!(ranges = malloc(sizeof *ranges * 2 * (size_t)rows))) { rc = -ENOMEM; break; }
      rc = parse_maps(maps, len, exe, ranges, &nranges, &exe_row, &libc_row);
      m.ranges = ranges, m.nranges = nranges;
    }
    uint64_t slot = 0;
    int word = 8;
    if (rc >= 0) {
      if ((rc = locate(&exe_row, &libc_row, objs, nobjs, obj_paths, &slot, &word, info, st, need_path, need_len)) < 0)
        break;
      rc = snapshot(&m, slot, word, sink);
      st[ST_BYTES] += m.read;
    }
    if (rc != LM_TORN) break;
    if (attempt >= retries) { st[ST_RETRIES] = retries; break; }
    st[ST_RETRIES] = attempt + 1;
    sched_yield(); /* let the writer finish what it is changing */
  }
  free(maps), free(ranges);
  if (qfd >= 0) close(qfd);
  close(fd), close(dfd);
  return rc < 0 ? rc : sink->count - count0;
}

/* Every process of pids (exes[i]: its /proc/<pid>/exe, or NULL to read it), in order, from proc_root.
 * rules: {u8 kind, u32 len, bytes[, u32 len, expected value bytes]}... Each process's status is in
 * status[ST_COUNT * i]; its records ({u8 kind, u32 name length, u32 value length, name, value}...)
 * at ST_OFF in out. Returns how many processes were read; it stops before the last one where
 * info[I_STOP] says why: LM_NEED (an object to resolve, in info and need_path: then call again from
 * that process, the object added to objs), -ENOBUFS (out is full: call again from there with a
 * larger one) or -ENAMETOOLONG (the object's path, info[I_PATH_LEN] bytes, is longer than
 * need_path: call again with one that holds it). */
EXPORT int64_t ncclprobe_live_read_tree(const char* proc_root, const int32_t* pids, const char* const* exes,
                                        int32_t npids, const lm_obj* objs, int32_t nobjs, const char* obj_paths,
                                        const char* rules, int64_t rules_len, int32_t retries, char* out,
                                        int64_t out_len, int64_t* status, char* need_path, int64_t need_len,
                                        int64_t* info) {
  char base[4200];
  lm_sink sink = {rules, rules_len, out, out_len, 0, 0};
  memset(info, 0, I_COUNT * sizeof *info);
  for (int32_t i = 0; i < npids; i++) {
    int64_t* st = status + ST_COUNT * i;
    memset(st, 0, ST_COUNT * sizeof *st);
    st[ST_NOSLOT0] = st[ST_NOSLOT1] = -1;
    snprintf(base, sizeof base, "%s/%d", proc_root, pids[i]);
    int64_t mark = sink.used_out;
    int64_t rc = read_process(base, exes ? exes[i] : NULL, objs, nobjs, obj_paths, retries, &sink, st, info,
                              need_path, need_len);
    if (rc == LM_NEED || rc == -ENOBUFS || rc == -ENAMETOOLONG) {
      sink.used_out = mark;
      info[I_STOP] = rc;
      return i;
    }
    st[ST_RC] = rc, st[ST_OFF] = mark, st[ST_LEN] = sink.used_out - mark;
  }
  return npids;
}

/* 1: read maps files even where the kernel has PROCMAP_QUERY (NCCLPROBE_NATIVE_LIVE=maps, to compare). */
EXPORT void ncclprobe_live_read_maps(int32_t on) { lm_no_query = on != 0; }
