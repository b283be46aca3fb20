/* procread.c - the /proc reader behind `ncclprobe inspect`: every file it needs of every process in
 * a tree, read in one ctypes call, each process's files relative to its directory. On a tree of
 * hundreds of processes the kernel's work is then most of the cost: from Python, each of the ~10
 * system calls per process and each copy of what they return costs more than the call itself. Runs in
 * the ncclprobe process only, never inside a diagnosed one.
 *
 * One call reads a whole tree. It numbers every distinct value it returns, per kind: a process whose
 * command line, environment, maps, ... are byte for byte those of an earlier one (exec'ed siblings)
 * gets that value's number and no bytes, so Python parses each distinct value once and never copies
 * or hashes the repeats. Equal bytes, not equal hashes, make a value the same.
 *
 * The output (`out`, PR_OUT int64s per process; ncclprobe/procread.py names them) holds the stat fields procs
 * uses, the owner's uid (the owner of /proc/<pid>: the task's euid, fs/proc/base.c task_dump_owner),
 * and per kind {errno, value number, offset, length}; the bytes of a new value are at that offset in
 * `buf`. The directory is opened once (O_PATH), so a PID reused mid-read cannot mix two processes.
 *
 * `run`'s watch of a tree (ncclprobe_proc_watch) walks it the same way, but reads a process it knows
 * already (the caller names them) as R_KNOWN: its stat and children only, the membership scan; a
 * process new to it gets comm, cmdline, exe and environ (no maps, root or namespace), and no
 * ancestors are read. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define PF_KTHREAD 0x00200000 /* include/linux/sched.h: no mm, so no environ or maps */

/* kinds of values, in output order; children are not numbered (they differ between processes). A
 * class is the numbers of a process's other values together: processes of one class differ only in
 * their stat fields and owner. */
enum { K_COMM, K_CMDLINE, K_EXE, K_ENVIRON, K_MAPS, K_ROOT, K_MNT, K_CHILDREN, K_COUNT, K_CLASS = K_COUNT };
/* fixed slots of the output, then K_COUNT groups of {errno, number, offset, length}. O_SPECIAL: the
 * process is not plain (an error reading it, no mm, an empty environment, an ancestor): its class is
 * not set. O_FRESH: how many of its values are new (their bytes are in buf). O_ROLE: R_TREE, or
 * R_EXCLUDED (left out with everything under it: nothing read), or R_ANCESTOR (above a root: no
 * environ, maps or children read). O_MAPS_HOW: M_QUERY (PROCMAP_QUERY) or M_READ (maps read). */
enum { O_ERR, O_PID, O_PPID, O_STATE, O_FLAGS, O_START, O_THREADS, O_SPAN0, O_SPAN1, O_SPAN2, O_SPAN3,
       O_UID, O_UID_ERR, O_SPECIAL, O_CLASS, O_FRESH, O_ROLE, O_MAPS_HOW, O_KINDS };
enum { M_NONE, M_QUERY, M_READ }; /* O_MAPS_HOW: how its maps rows were read */
enum { R_TREE, R_EXCLUDED, R_ANCESTOR, R_KNOWN };
enum { MODE_READ_MAPS = 1, MODE_WATCH = 2 }; /* tree_walk: read maps files always; the watch's walk */
#define PR_OUT (O_KINDS + 4 * K_COUNT)
/* What one file may hold before it is refused with EFBIG (procs.Reader keeps the same caps): stat is
 * one short record; cmdline and environ are at most ARG_MAX at exec (6 MiB since Linux 4.13) unless
 * rewritten through prctl(PR_SET_MM); maps rows are bounded by vm.max_map_count (65530 by default).
 * A hostile or fake /proc file can claim any size (a sparse file): the cap bounds time and memory. */
#define PR_MAX_RECORD (1 << 20)
#define PR_MAX_FILE (32 << 20)
#define PR_MAX_ROWS 65536 /* maps rows kept (executable or shared file mappings), segments merged */
#define PR_MAX_INODE_DIGITS 20 /* 2^64 - 1 */

typedef struct {
  uint64_t hash;
  int64_t off, len;
  int32_t kind, num;
} pr_entry;

typedef struct {
  char root[4096];
  pr_entry* tab; /* open addressing, a power of two */
  size_t tab_cap, tab_len;
  char* arena; /* every distinct value's bytes */
  size_t arena_cap, arena_len;
  int32_t next_num[K_COUNT + 1];
  int no_query; /* PROCMAP_QUERY refused once: read maps for the rest of the walk */
} pr_reader;

typedef struct {
  char* buf;
  int64_t cap, used;
} pr_out;

static uint64_t hash_bytes(const char* p, size_t n, uint64_t h) {
  uint64_t w;
  for (; n >= 8; n -= 8, p += 8) {
    memcpy(&w, p, 8);
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  w = 0;
  memcpy(&w, p, n);
  h = (h ^ w ^ ((uint64_t)n << 56)) * 0x9E3779B97F4A7C15ull;
  return h ^ (h >> 32);
}

static int grow_table(pr_reader* r) {
  size_t cap = r->tab_cap ? r->tab_cap * 2 : 1024;
  pr_entry* tab = calloc(cap, sizeof *tab);
  if (!tab) return ENOMEM;
  for (size_t i = 0; i < r->tab_cap; i++) {
    pr_entry* e = &r->tab[i];
    if (!e->num) continue; /* free */
    size_t j = e->hash & (cap - 1);
    while (tab[j].num) j = (j + 1) & (cap - 1);
    tab[j] = *e;
  }
  free(r->tab);
  r->tab = tab;
  r->tab_cap = cap;
  return 0;
}

/* The number of the value (kind, bytes), and whether it is new (then its bytes stay in out). Numbers
 * count from 1 in each kind; table slots with num 0 are free. */
static int intern(pr_reader* r, int kind, const char* p, int64_t n, int32_t* num, int* fresh) {
  if (2 * (r->tab_len + 1) > r->tab_cap && grow_table(r)) return ENOMEM;
  uint64_t h = hash_bytes(p, (size_t)n, 0x243F6A8885A308D3ull + (uint64_t)kind);
  size_t j = h & (r->tab_cap - 1);
  for (; r->tab[j].num; j = (j + 1) & (r->tab_cap - 1)) {
    pr_entry* e = &r->tab[j];
    if (e->hash == h && e->kind == kind && e->len == n && (!n || !memcmp(r->arena + e->off, p, (size_t)n))) {
      *num = e->num;
      *fresh = 0;
      return 0;
    }
  }
  if (r->arena_len + (size_t)n > r->arena_cap) {
    size_t cap = r->arena_cap ? r->arena_cap : 1 << 16;
    while (cap < r->arena_len + (size_t)n) cap *= 2;
    char* a = realloc(r->arena, cap);
    if (!a) return ENOMEM;
    r->arena = a;
    r->arena_cap = cap;
  }
  if (n) memcpy(r->arena + r->arena_len, p, (size_t)n);
  r->tab[j] = (pr_entry){h, (int64_t)r->arena_len, n, kind, ++r->next_num[kind]};
  r->arena_len += (size_t)n;
  r->tab_len++;
  *num = r->tab[j].num;
  *fresh = 1;
  return 0;
}

/* Appends the file to out. `whole`: the kernel fills these in one call (stat: one-record seq_file;
 * cmdline, environ: fs/proc/base.c loops until done), so a short read is the end; maps and children
 * are multi-record seq_files that stop at a page, read to 0. ENOBUFS: out is too small; EFBIG: the
 * file holds more than `limit` bytes (nothing of it is kept: the caller resets out->used). */
static int append_file(int dfd, const char* name, pr_out* out, int whole, int64_t limit) {
  int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return errno;
  int err = 0;
  int64_t got = 0;
  for (;;) {
    int64_t room = out->cap - out->used;
    if (room > limit + 1 - got) room = limit + 1 - got; /* one byte past the cap tells it is exceeded */
    if (room <= 0) {
      err = got > limit ? EFBIG : ENOBUFS;
      break;
    }
    ssize_t n = read(fd, out->buf + out->used, (size_t)room);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    if (n == 0) break;
    out->used += n;
    got += n;
    if (got > limit) {
      err = EFBIG;
      break;
    }
    if (whole && n < room) break;
  }
  close(fd);
  return err;
}

static int append_link(int dfd, const char* name, pr_out* out) {
  int64_t room = out->cap - out->used;
  if (room <= 0) return ENOBUFS;
  ssize_t n = readlinkat(dfd, name, out->buf + out->used, (size_t)room);
  if (n < 0) return errno;
  if (n == room) return ENOBUFS; /* possibly cut short */
  out->used += n;
  return 0;
}

/* Every thread's children file (fs/proc/array.c get_children_pid lists the children the thread
 * forked), space-separated; the main thread's alone when the process has one thread. */
static int append_children(int dfd, int64_t pid, int64_t threads, pr_out* out) {
  char name[64];
  if (threads <= 1) {
    snprintf(name, sizeof name, "task/%lld/children", (long long)pid);
    return append_file(dfd, name, out, 0, PR_MAX_FILE);
  }
  int tfd = openat(dfd, "task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (tfd < 0) return errno;
  DIR* dir = fdopendir(tfd);
  if (!dir) {
    int e = errno;
    close(tfd);
    return e;
  }
  int err = 0;
  struct dirent* de;
  while (!err && (de = readdir(dir)) != NULL) {
    if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
    snprintf(name, sizeof name, "%.32s/children", de->d_name);
    int64_t before = out->used;
    err = append_file(dirfd(dir), name, out, 0, PR_MAX_FILE);
    if (err == ENOENT || err == ESRCH) { /* the thread exited since the listing: no children */
      out->used = before;
      err = 0;
    } else if (!err) {
      if (out->used >= out->cap) err = ENOBUFS;
      else out->buf[out->used++] = ' ';
    }
  }
  closedir(dir);
  return err;
}

static int64_t filter_maps(char* s, int64_t n);
static int64_t sort_rows(char* s, int64_t len);

typedef struct {
  const char* p;
  size_t n;
} pr_line;

static int line_cmp(const void* a, const void* b) { /* as Python compares bytes */
  const pr_line *x = a, *y = b;
  int c = memcmp(x->p, y->p, x->n < y->n ? x->n : y->n);
  return c ? c : (x->n > y->n) - (x->n < y->n);
}

/* Maps rows as sorted "perms dev inode path\n" lines: the file mappings inspect looks at (executable
 * ones: libraries; shared ones: GPU device nodes), the address range and offset left out. Those
 * differ between processes that map the same files (ASLR), so does the order of the libraries, and
 * the column padding follows the address width; what is left is the same for them. In place: the
 * output never runs ahead of the input. procs.normalise_maps does the same in Python (without
 * merging segments) and procs.parse_rows reads both. -ENOMEM, or -EFBIG: more than PR_MAX_ROWS rows. */
static int64_t normalise_maps(char* s, int64_t n) { return sort_rows(s, filter_maps(s, n)); }

/* The rows in s (len bytes, each ending in a newline) in byte order, each once; the new length.
 * -ENOMEM, or -EFBIG: more than PR_MAX_ROWS rows (no process maps that many files). */
static int64_t sort_rows(char* s, int64_t len) {
  size_t lines = 0;
  for (int64_t i = 0; i < len; i++) lines += s[i] == '\n';
  if (lines < 2) return len;
  pr_line* v = malloc(lines * sizeof *v);
  char* copy = malloc((size_t)len);
  if (!v || !copy) {
    free(v);
    free(copy);
    return -ENOMEM;
  }
  memcpy(copy, s, (size_t)len);
  size_t k = 0;
  for (char *p = copy, *end = copy + len; p < end; k++) {
    char* eol = memchr(p, '\n', (size_t)(end - p));
    v[k] = (pr_line){p, (size_t)(eol - p + 1)};
    p = eol + 1;
  }
  qsort(v, lines, sizeof *v, line_cmp);
  char* w = s;
  size_t kept = 0;
  for (k = 0; k < lines; k++) {
    if (k && !line_cmp(&v[k], &v[k - 1])) continue; /* the same row again (another segment) */
    memcpy(w, v[k].p, v[k].n);
    w += v[k].n;
    kept++;
  }
  free(v);
  free(copy);
  return kept > PR_MAX_ROWS ? -EFBIG : w - s;
}

/* The executable or shared file-backed rows, as normalise_maps wants them, in their order;
 * consecutive rows of one file (its segments) are one row, executable if any of them is. */
static int64_t filter_maps(char* s, int64_t n) {
  char* w = s;
  char* end = s + n;
  char* last = NULL; /* the dev of the row written last */
  size_t last_len = 0; /* from there to its end, without the newline */
  for (char* line = s; line < end;) {
    char* eol = memchr(line, '\n', (size_t)(end - line));
    if (!eol) eol = end;
    char* next = eol < end ? eol + 1 : end;
    char* p = memchr(line, ' ', (size_t)(eol - line)); /* after the address range */
    if (!p || eol - p < 7 || p[5] != ' ') goto skip;
    char* perms = p + 1;
    if (perms[2] != 'x' && perms[3] != 's') goto skip; /* neither a library's code nor a device */
    char* q = memchr(p + 6, ' ', (size_t)(eol - p - 6)); /* after the offset */
    if (!q) goto skip;
    char* dev = q + 1;
    char* r = memchr(dev, ' ', (size_t)(eol - dev));
    if (!r) goto skip;
    char* ino = r + 1;
    char* ie = ino;
    while (ie < eol && *ie >= '0' && *ie <= '9') ie++;
    if (ie == ino || (ie - ino == 1 && *ino == '0')) goto skip; /* no inode: anonymous */
    if (ie - ino > PR_MAX_INODE_DIGITS) goto skip; /* not an inode number (procs.parse_rows agrees) */
    char* path = ie;
    while (path < eol && *path == ' ') path++;
    if (path == ie || path >= eol || *path != '/') goto skip;
    if (memchr(path, '\0', (size_t)(eol - path))) goto skip; /* a kernel path never holds a NUL */
    size_t dev_len = (size_t)(r - dev), ino_len = (size_t)(ie - ino), path_len = (size_t)(eol - path);
    size_t len = dev_len + 1 + ino_len + 1 + path_len;
    if (last && len == last_len && !memcmp(last, dev, dev_len) && !memcmp(last + dev_len + 1, ino, ino_len) &&
        !memcmp(last + dev_len + 1 + ino_len + 1, path, path_len)) {
      if (perms[2] == 'x') last[-3] = 'x'; /* the row's perms, at w - 5 when it was written */
      goto skip;
    }
    memmove(w, perms, 4);
    w[4] = ' ';
    last = w + 5;
    memmove(last, dev, dev_len);
    last[dev_len] = ' ';
    memmove(last + dev_len + 1, ino, ino_len);
    last[dev_len + 1 + ino_len] = ' ';
    memmove(last + dev_len + 1 + ino_len + 1, path, path_len);
    last_len = len;
    w = last + len;
    *w++ = '\n';
  skip:
    line = next;
  }
  return w - s;
}

/* PROCMAP_QUERY (Linux 6.11, include/uapi/linux/fs.h): one mapping per ioctl on an open maps file,
 * filtered by the kernel. Asking only for the executable and the shared file mappings skips the
 * formatting of every other line, most of the cost of reading maps. */
struct pr_procmap_query {
  uint64_t size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
  uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
  uint64_t vma_name_addr, build_id_addr;
};
#define PR_PROCMAP_QUERY 0xC0686611 /* _IOWR('f', 17, struct procmap_query) */
enum { Q_READABLE = 1, Q_WRITABLE = 2, Q_EXECUTABLE = 4, Q_SHARED = 8, Q_COVERING_OR_NEXT = 0x10, Q_FILE_BACKED = 0x20 };

static int append_row(pr_out* o, const char* text, size_t n) {
  if (o->cap - o->used < (int64_t)n) return ENOBUFS;
  memcpy(o->buf + o->used, text, n);
  o->used += (int64_t)n;
  return 0;
}

/* The rows normalise_maps makes of maps, from PROCMAP_QUERY. ENOTTY: the kernel has no such ioctl
 * (the caller reads maps instead). */
static int append_maps_query(int dfd, pr_out* o) {
  int fd = openat(dfd, "maps", O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return errno;
  static const uint64_t kinds[] = {Q_EXECUTABLE, Q_SHARED};
  char name[PATH_MAX + 64];
  char row[64];
  int err = 0;
  int64_t start = o->used;
  for (int pass = 0; pass < 2 && !err; pass++) {
    uint64_t addr = 0;
    for (;;) {
      struct pr_procmap_query q;
      memset(&q, 0, sizeof q);
      q.size = sizeof q;
      q.query_flags = Q_COVERING_OR_NEXT | Q_FILE_BACKED | kinds[pass];
      q.query_addr = addr;
      q.vma_name_addr = (uint64_t)(uintptr_t)name;
      q.vma_name_size = sizeof name;
      if (ioctl(fd, PR_PROCMAP_QUERY, &q) < 0) {
        if (errno != ENOENT) err = errno; /* ENOENT: no mapping at or after addr */
        break;
      }
      addr = q.vma_end;
      if (!q.inode || name[0] != '/') continue; /* as the maps rows normalise_maps leaves out */
      int n = snprintf(row, sizeof row, "%c%c%c%c %02x:%02x %llu ", q.vma_flags & Q_READABLE ? 'r' : '-',
                       q.vma_flags & Q_WRITABLE ? 'w' : '-', q.vma_flags & Q_EXECUTABLE ? 'x' : '-',
                       q.vma_flags & Q_SHARED ? 's' : 'p', q.dev_major, q.dev_minor, (unsigned long long)q.inode);
      if (o->used - start > PR_MAX_FILE) {
        err = EFBIG;
        break;
      }
      if (!(err = append_row(o, row, (size_t)n))) {
        size_t bound = q.vma_name_size ? q.vma_name_size - 1 : 0; /* the name and its NUL */
        for (size_t c = 0; c < bound && name[c] && !err; c++) /* maps escapes a newline (seq_path) */
          err = name[c] == '\n' ? append_row(o, "\\012", 4) : append_row(o, name + c, 1);
      }
      if (!err) err = append_row(o, "\n", 1);
      if (err) break;
    }
  }
  close(fd);
  if (!err) {
    int64_t len = sort_rows(o->buf + start, o->used - start);
    if (len < 0) err = (int)-len;
    else o->used = start + len;
  }
  return err;
}

/* stat's fields after comm (proc(5) numbers them from 1: state is field 3); comm may hold spaces and
 * ')'. Returns EINVAL for anything else. */
static int parse_stat(const char* s, int64_t n, int64_t* out, int64_t* comm_off, int64_t* comm_len) {
  const char* end = s + n;
  const char* open = memchr(s, '(', (size_t)n);
  const char* close = NULL;
  for (const char* q = s; q < end; q++)
    if (*q == ')') close = q;
  if (!open || !close || close < open || close + 2 >= end) return EINVAL;
  const char* p = close + 2;
  int state = (unsigned char)*p;
  int64_t f[52] = {0};
  int nf = 0;
  for (p++; p < end && nf < 52; nf++) { /* f[i] is field i + 4 */
    while (p < end && *p == ' ') p++;
    if (p >= end || *p == '\n') break;
    int neg = *p == '-';
    if (neg) p++;
    uint64_t v = 0; /* unsigned: rsslim (field 25) is 2^64 - 1 when unlimited */
    while (p < end && *p >= '0' && *p <= '9') v = v * 10 + (uint64_t)(*p++ - '0');
    f[nf] = neg ? -(int64_t)v : (int64_t)v;
    while (p < end && *p != ' ') p++;
  }
  if (nf < 19) return EINVAL; /* the slot keeps the pid of the directory read */
  *comm_off = open + 1 - s;
  *comm_len = close - open - 1;
  out[O_STATE] = state;
  out[O_PPID] = f[0];
  out[O_FLAGS] = f[5];
  out[O_THREADS] = f[16];
  out[O_START] = f[18];
  for (int i = 0; i < 4; i++) out[O_SPAN0 + i] = nf >= 48 ? f[44 + i] : 0; /* arg_start .. env_end */
  return 0;
}

/* Reads one process into o (from o->used on) and its PR_OUT slots. Only the values new to r keep their
 * bytes, moved down to where o->used was; known ones get their number. Returns 0 (a process that
 * cannot be read has its errno in out[O_ERR]), ENOBUFS or ENOMEM. Kernel threads and zombies have no
 * mm, so no environ or maps. */
static int read_one(pr_reader* r, int pid, int role, int watch, pr_out* o, int64_t* out) {
  char dir[4200];
  memset(out, 0, PR_OUT * sizeof *out);
  out[O_PID] = pid;
  out[O_ROLE] = role;
  snprintf(dir, sizeof dir, "%s/%d", r->root, pid);
  int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    out[O_ERR] = errno;
    return 0;
  }
  int64_t mark = o->used;
  int64_t at[K_COUNT], len[K_COUNT]; /* where each kind's bytes are in buf, before numbering */
  int err = append_file(dfd, "stat", o, 1, PR_MAX_RECORD);
  if (!err) err = parse_stat(o->buf + mark, o->used - mark, out, &at[K_COMM], &len[K_COMM]);
  if (err) {
    close(dfd);
    o->used = mark;
    if (err == ENOBUFS) return ENOBUFS;
    out[O_ERR] = err;
    return 0;
  }
  at[K_COMM] += mark;
  if (role == R_KNOWN) { /* the watch knows it: stat (read above) and children, nothing numbered */
    o->used = mark;
    int64_t* ch = out + O_KINDS + 4 * K_CHILDREN;
    err = append_children(dfd, out[O_PID], out[O_THREADS], o);
    close(dfd);
    if (err == ENOBUFS) {
      o->used = mark;
      return ENOBUFS;
    }
    if (err) o->used = mark;
    ch[0] = err;
    ch[2] = mark;
    ch[3] = o->used - mark;
    out[O_SPECIAL] = 1;
    return 0;
  }
  struct stat st;
  if (fstat(dfd, &st) == 0) out[O_UID] = st.st_uid;
  else out[O_UID_ERR] = errno;
  int no_mm = (out[O_FLAGS] & PF_KTHREAD) || out[O_STATE] == 'Z' || out[O_STATE] == 'X';
  int above = role == R_ANCESTOR; /* only what an ancestor's shell command line needs */
  for (int k = K_CMDLINE; k < K_COUNT; k++) {
    int64_t start = o->used;
    int e;
    int skip = watch && (k == K_MAPS || k == K_ROOT || k == K_MNT); /* the watch reads none of them */
    switch (skip ? -1 : k) {
      case -1: e = 0; break;
      case K_EXE: e = append_link(dfd, "exe", o); break;
      case K_ROOT: e = append_link(dfd, "root", o); break;
      case K_MNT: e = append_link(dfd, "ns/mnt", o); break;
      case K_CMDLINE: e = append_file(dfd, "cmdline", o, 1, PR_MAX_FILE); break;
      case K_ENVIRON: e = no_mm ? ENOENT : above ? 0 : append_file(dfd, "environ", o, 1, PR_MAX_FILE); break;
      case K_MAPS:
        if (no_mm || above) {
          e = no_mm ? ENOENT : 0;
          break;
        }
        e = r->no_query ? ENOTTY : append_maps_query(dfd, o);
        out[O_MAPS_HOW] = M_QUERY;
        if (e == ENOTTY || e == EINVAL || e == ENAMETOOLONG) {
          /* before Linux 6.11, or not procfs (a test's fake /proc): read maps from now on; a path
           * longer than PATH_MAX (d_path fails): read this process's maps */
          r->no_query |= e != ENAMETOOLONG;
          out[O_MAPS_HOW] = M_READ;
          o->used = start;
          e = append_file(dfd, "maps", o, 0, PR_MAX_FILE);
          int64_t kept = e ? 0 : normalise_maps(o->buf + start, o->used - start);
          if (kept == -ENOMEM) {
            close(dfd);
            o->used = mark;
            return ENOMEM;
          }
          if (kept < 0) e = (int)-kept; /* EFBIG: more rows than a process maps */
          else if (!e) o->used = start + kept;
        }
        break;
      default: e = above ? 0 : append_children(dfd, out[O_PID], out[O_THREADS], o); break;
    }
    if (e == ENOBUFS) {
      close(dfd);
      o->used = mark;
      return ENOBUFS;
    }
    if (e) o->used = start;
    out[O_KINDS + 4 * k] = e;
    at[k] = start;
    len[k] = o->used - start;
  }
  close(dfd);
  int special = out[O_UID_ERR] || no_mm || above || len[K_ENVIRON] == 0;
  /* number every value; new ones keep their bytes, moved down to mark (never past where they are) */
  int64_t w = mark;
  for (int k = 0; k < K_COUNT; k++) {
    int64_t* slot = out + O_KINDS + 4 * k;
    if (slot[0]) {
      special |= k != K_CHILDREN;
      continue;
    }
    int32_t num = 0;
    int fresh = 1;
    if (k != K_CHILDREN && (err = intern(r, k, o->buf + at[k], len[k], &num, &fresh))) return err;
    slot[1] = num;
    slot[2] = w;
    slot[3] = fresh ? len[k] : -1; /* -1: a value returned before, no bytes */
    if (fresh) {
      memmove(o->buf + w, o->buf + at[k], (size_t)len[k]);
      w += len[k];
      out[O_FRESH] += k != K_CHILDREN;
    }
  }
  o->used = w;
  out[O_SPECIAL] = special;
  if (!special) {
    int32_t nums[K_CHILDREN], num;
    int fresh;
    for (int k = 0; k < K_CHILDREN; k++) nums[k] = (int32_t)out[O_KINDS + 4 * k + 1];
    if ((err = intern(r, K_CLASS, (const char*)nums, sizeof nums, &num, &fresh))) return err;
    out[O_CLASS] = num;
  }
  return 0;
}

/* A set of pids (open addressing; 0 is free). */
typedef struct {
  int* slot;
  size_t cap, len;
} pid_set;

static int pid_add(pid_set* s, int pid) { /* 1 added, 0 present, -1 ENOMEM */
  if (2 * (s->len + 1) > s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 1024;
    int* slot = calloc(cap, sizeof *slot);
    if (!slot) return -1;
    for (size_t i = 0; i < s->cap; i++) {
      if (!s->slot[i]) continue;
      size_t j = ((size_t)s->slot[i] * 2654435761u) & (cap - 1);
      while (slot[j]) j = (j + 1) & (cap - 1);
      slot[j] = s->slot[i];
    }
    free(s->slot);
    s->slot = slot;
    s->cap = cap;
  }
  size_t j = ((size_t)pid * 2654435761u) & (s->cap - 1);
  for (; s->slot[j]; j = (j + 1) & (s->cap - 1))
    if (s->slot[j] == pid) return 0;
  s->slot[j] = pid;
  s->len++;
  return 1;
}

static int pid_has(const pid_set* s, int pid) {
  if (!s->cap) return 0;
  for (size_t j = ((size_t)pid * 2654435761u) & (s->cap - 1); s->slot[j]; j = (j + 1) & (s->cap - 1))
    if (s->slot[j] == pid) return 1;
  return 0;
}

static int push(int** stack, size_t* depth, size_t* cap, int pid) {
  if (*depth == *cap) {
    size_t c = *cap ? 2 * *cap : 256;
    int* st = realloc(*stack, c * sizeof *st);
    if (!st) return ENOMEM;
    *stack = st;
    *cap = c;
  }
  (*stack)[(*depth)++] = pid;
  return 0;
}

static int has(const int* v, int n, int pid) {
  for (int i = 0; i < n; i++)
    if (v[i] == pid) return 1;
  return 0;
}

static int int_cmp(const void* a, const void* b) { return (*(const int*)a > *(const int*)b) - (*(const int*)a < *(const int*)b); }

/* Reads every process under the roots (threads excluded) depth first, in the order procs.walk lists
 * them: each root in turn, children by ascending pid; a process in `exclude` (not a root) gets an
 * R_EXCLUDED slot and nothing under it is read. Then the ancestors of each root, up to the first one
 * already read. `out` gets PR_OUT int64s per process in that order, `buf` the bytes of each new
 * value. Returns the number of slots, or -ENOBUFS (buf too small) or -ERANGE (out too small): call
 * again with a larger one; -ENOMEM. Under a process whose children file failed nothing is read (its errno is in its
 * slot: the caller then cannot trust the tree). Values are numbered afresh in each call. read_maps:
 * read every maps file, even where the kernel has PROCMAP_QUERY. */
static int64_t tree_walk(const char* proc_root, const int* roots, int nroots, const int* exclude, int nexclude,
                         const int* known, int nknown, char* buf, int64_t cap, int64_t* out, int64_t max_procs,
                         int mode);

EXPORT int64_t ncclprobe_proc_tree(const char* proc_root, const int* roots, int nroots, const int* exclude,
                                   int nexclude, char* buf, int64_t cap, int64_t* out, int64_t max_procs,
                                   int read_maps) {
  return tree_walk(proc_root, roots, nroots, exclude, nexclude, NULL, 0, buf, cap, out, max_procs,
                   read_maps ? MODE_READ_MAPS : 0);
}

/* The watch's scan (ncclprobe/commands/watch.py): the walk above, without ancestors; a process in
 * `known` (a root too) is read as R_KNOWN: stat and children only. The others get comm, cmdline, exe
 * and environ; maps, root and ns/mnt are left unread (errno 0, no bytes). */
EXPORT int64_t ncclprobe_proc_watch(const char* proc_root, const int* roots, int nroots, const int* exclude,
                                    int nexclude, const int* known, int nknown, char* buf, int64_t cap,
                                    int64_t* out, int64_t max_procs) {
  return tree_walk(proc_root, roots, nroots, exclude, nexclude, known, nknown, buf, cap, out, max_procs, MODE_WATCH);
}

static int64_t tree_walk(const char* proc_root, const int* roots, int nroots, const int* exclude, int nexclude,
                         const int* known, int nknown, char* buf, int64_t cap, int64_t* out, int64_t max_procs,
                         int mode) {
  pr_reader r = {0};
  r.no_query = mode & MODE_READ_MAPS; /* asked to read maps even where PROCMAP_QUERY would do */
  int watch = mode & MODE_WATCH;
  if (snprintf(r.root, sizeof r.root, "%s", proc_root) >= (int)sizeof r.root) return -ENAMETOOLONG;
  pr_out o = {buf, cap, 0};
  pid_set seen = {0}, knows = {0};
  int *stack = NULL, *kids = NULL;
  size_t depth = 0, stack_cap = 0, kids_cap = 0;
  int64_t n = 0;
  int rc = 0;
  for (int i = 0; i < nknown && !rc; i++)
    if (known[i] > 0 && pid_add(&knows, known[i]) < 0) rc = ENOMEM;
  for (int i = nroots - 1; i >= 0 && !rc; i--) rc = push(&stack, &depth, &stack_cap, roots[i]); /* popped in order */
  while (depth && !rc) {
    int pid = stack[--depth];
    int added = pid_add(&seen, pid);
    if (added < 0) rc = ENOMEM;
    if (added <= 0) continue;
    if (n >= max_procs) {
      rc = ERANGE; /* out is too small */
      break;
    }
    int64_t* slot = out + n * PR_OUT;
    if (has(exclude, nexclude, pid) && !has(roots, nroots, pid)) {
      memset(slot, 0, PR_OUT * sizeof *slot);
      slot[O_PID] = pid;
      slot[O_ROLE] = R_EXCLUDED;
      n++;
      continue;
    }
    int role = pid_has(&knows, pid) ? R_KNOWN : R_TREE;
    if ((rc = read_one(&r, pid, role, watch, &o, slot))) break;
    n++;
    int64_t* ch = slot + O_KINDS + 4 * K_CHILDREN;
    if (slot[O_ERR] || ch[0]) continue;
    size_t nkids = 0;
    for (char *p = o.buf + ch[2], *end = p + ch[3]; p < end && !rc;) {
      while (p < end && (*p < '0' || *p > '9')) p++;
      if (p >= end) break;
      uint64_t child = 0;
      while (p < end && *p >= '0' && *p <= '9') {
        child = child * 10 + (uint64_t)(*p++ - '0');
        if (child > INT_MAX) child = 0; /* not a pid: skipped */
      }
      if (child) rc = push(&kids, &nkids, &kids_cap, (int)child);
    }
    if (nkids > 1) qsort(kids, nkids, sizeof *kids, int_cmp);
    while (nkids && !rc) rc = push(&stack, &depth, &stack_cap, kids[--nkids]); /* the smallest on top */
    o.used -= ch[3]; /* the children are on the stack: their bytes are not needed */
    ch[3] = 0;
  }
  /* each root's ancestors, up to one read already */
  int64_t tree_n = n;
  for (int i = 0; i < nroots && !rc && !watch; i++) {
    int64_t ppid = 0;
    for (int64_t j = 0; j < tree_n; j++) {
      int64_t* slot = out + j * PR_OUT;
      if (slot[O_PID] == roots[i] && slot[O_ROLE] == R_TREE && !slot[O_ERR]) ppid = slot[O_PPID];
    }
    while (ppid > 0 && ppid <= INT_MAX && !rc) {
      int added = pid_add(&seen, (int)ppid);
      if (added <= 0) {
        rc = added < 0 ? ENOMEM : 0;
        break;
      }
      if (n >= max_procs) {
        rc = ERANGE;
        break;
      }
      int64_t* slot = out + n * PR_OUT;
      if ((rc = read_one(&r, (int)ppid, R_ANCESTOR, 0, &o, slot))) break;
      n++;
      ppid = slot[O_ERR] ? 0 : slot[O_PPID];
    }
  }
  free(stack);
  free(kids);
  free(seen.slot);
  free(knows.slot);
  free(r.tab);
  free(r.arena);
  return rc ? -rc : n;
}
