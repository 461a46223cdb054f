/*
 * nng_shm.c - the same-host path of the nng transport: a reply's bytes
 * in shared memory instead of through the socket (docs/protocol.md,
 * "Same-host shared memory").
 *
 * A client whose connection asks for it (cwi_transport_opts.shm_bytes)
 * creates a region on each new link: a sparse file in /dev/shm, mode
 * 0600, mapped, its head naming a random nonce. It sends the file's name,
 * size and nonce to the server in a hello frame (kind 2) before its other
 * requests. A server that can open that file (the same host, the same
 * user) and finds the nonce in it maps it, removes the name and answers
 * yes; from then on it may send a large reply as a block of the region:
 * it writes the reply's bytes (the request id and the frame, exactly as
 * the socket would have carried them) into a free block of the file
 * (pwritev from where the payloads lie: a full /dev/shm is then a failed
 * write and the socket, never SIGBUS) and sends only a
 * block frame (kind 3: slot, offset, length) on the socket. The client
 * reads the block in place: the received tensors view the mapping, and
 * when the last of them goes the block's slot is marked free in the
 * region's head, where the server looks for free blocks. Nothing is
 * copied on the client and the socket carries a few dozen bytes per
 * reply instead of the batch (the W5 profile: the kernel's copies and
 * the socket-buffer-sized hand-offs of a 9.6 MB batch).
 *
 * The server's allocator is private to it (the client writes only its
 * slots' flags, which the server only reads): a block goes in the lowest
 * gap between the blocks in use that fits it (first fit by offset), so
 * the pages touched stay about those of the most the client held at once
 * and a block the client keeps long (a partial batch held to be stitched
 * to the next) pins only its own bytes; the pages written past the
 * blocks in use after a burst go back to the system (trim_locked). A
 * reply that finds no room (a client holding many replies) goes through
 * the socket as before.
 *
 * Trust: the region is shared by two processes of one user. The server
 * checks what it opens (a regular file of its user, the size the hello
 * names, the nonce, a layout that fits the file) and never maps it:
 * flags with pread/pwrite, blocks with pwritev, so a client shrinking the
 * file cannot raise SIGBUS in the worker of every job. The client checks
 * every block frame against the region before it makes a buffer of it. A
 * process forked after a block arrived never frees the parent's slots
 * (but may see a block its parent released reused: docs/protocol.md).
 */
#include "nng_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define SHM_DIR "/dev/shm/"
#define SHM_PREFIX "cachew-"
static const uint8_t shm_magic[8] = {'C', 'W', 'S', 'H', 'M', 0, 0, 1};

/* The region's head: written by the client before its hello, then only
 * the flags change. */
#define HEAD_MAGIC 0
#define HEAD_NONCE 8
#define HEAD_NSLOTS 24
#define HEAD_DATA_OFF 32
#define HEAD_DATA_LEN 40
#define HEAD_FLAGS 64
#define SHM_NONCE 16
#define SHM_SLOTS 256
#define SHM_ALIGN 64
#define SHM_MIN_DATA ((size_t)1 << 20)
#define SHM_MAX_DATA ((size_t)4 << 30)

/* hello: name length (1 byte), the name, the file's size (8), the nonce */
#define HELLO_FIXED (1 + 8 + SHM_NONCE)

typedef struct shm_slot {
	cwi_shm *r;
	uint32_t slot;
} shm_slot;

typedef struct shm_block {
	uint32_t slot;
	size_t off, len;
} shm_block;

struct cwi_shm {
	atomic_uint refs;
	bool server;
	uint8_t *map;
	size_t map_len;
	_Atomic(uint32_t) *flags;
	uint32_t nslots;
	uint8_t *data;
	size_t data_off, data_len;
	int fd; /* server: the file, written with pwritev (-1: none) */
	char name[SHM_NAME_MAX + 1];
	bool named; /* client: the file still has its name */
	uint8_t nonce[SHM_NONCE];
	pid_t pid; /* the client's: a child forked later frees nothing */
	shm_slot *slots; /* client: the free callbacks' contexts */
	/* server: the allocator (mtx) */
	pthread_mutex_t mtx;
	shm_block *blocks; /* by slot: where its block lies, if live */
	bool *live;	   /* by slot: given out, its flag not yet seen 0 */
	shm_block *order;  /* scratch: the live blocks by offset */
	uint32_t *seen;	   /* scratch: the flags as last read */
	uint32_t next_slot;
	size_t touched;  /* the end of the pages written so far */
	unsigned allocs; /* since the last trim */
};

/* Every TRIM_EVERY blocks, pages written past the blocks in use by more
 * than TRIM_SLACK go back to the system. */
#define TRIM_EVERY 64
#define TRIM_SLACK ((size_t)4 << 20)

static _Atomic uint64_t shm_unpacked;

bool
cwi_nng_shm_enabled(void)
{
	const char *v = getenv("CACHEW_SHM");

	return v == NULL || strcmp(v, "0") != 0;
}

/* n rounded up to a multiple of to. */
static size_t
round_up(size_t n, size_t to)
{
	return (n + to - 1) / to * to;
}

static size_t
head_bytes(uint32_t nslots)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t h = HEAD_FLAGS + (size_t)nslots * sizeof(uint32_t);

	return round_up(h, page);
}

static void
shm_free(cwi_shm *r)
{
	if (r->map != NULL)
		munmap(r->map, r->map_len);
	if (r->fd >= 0)
		close(r->fd);
	if (r->named)
		unlink(r->name);
	pthread_mutex_destroy(&r->mtx);
	free(r->slots);
	free(r->blocks);
	free(r->live);
	free(r->order);
	free(r->seen);
	free(r);
}

void
cwi_nng_shm_unref(cwi_shm *r)
{
	if (r != NULL && atomic_fetch_sub(&r->refs, 1) == 1)
		shm_free(r);
}

static cwi_shm *
shm_new(bool server)
{
	cwi_shm *r = calloc(1, sizeof(*r));

	if (r == NULL)
		return NULL;
	atomic_init(&r->refs, 1);
	r->server = server;
	r->fd = -1;
	pthread_mutex_init(&r->mtx, NULL);
	return r;
}

/* r's layout from the mapping's head (already checked). */
static void
shm_layout(cwi_shm *r, uint32_t nslots, size_t data_off, size_t data_len)
{
	r->nslots = nslots;
	if (r->map != NULL) {
		r->flags = (_Atomic(uint32_t) *)(r->map + HEAD_FLAGS);
		r->data = r->map + data_off;
	}
	r->data_off = data_off;
	r->data_len = data_len;
}

/* The nonce and the name need only be unguessable by other users and
 * unique among a process's regions. */
static void
random_bytes(uint8_t *p, size_t n)
{
	uint64_t x = cwi_now_ns() ^ ((uint64_t)getpid() << 32) ^
		     (uint64_t)(uintptr_t)p;

	if (getrandom(p, n, 0) == (ssize_t)n)
		return;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (uint8_t)x;
	}
}

static bool name_ok(const uint8_t *name, size_t n);

/* The head of a new region (hb bytes: the flags all 0), written to fd. */
static bool
write_head(int fd, const uint8_t *nonce, size_t hb, size_t bytes)
{
	uint8_t *h = calloc(1, hb);
	bool ok;

	if (h == NULL)
		return false;
	memcpy(h + HEAD_MAGIC, shm_magic, sizeof(shm_magic));
	memcpy(h + HEAD_NONCE, nonce, SHM_NONCE);
	cwi_nng_put_u32(h + HEAD_NSLOTS, SHM_SLOTS);
	cwi_nng_put_u64(h + HEAD_DATA_OFF, hb);
	cwi_nng_put_u64(h + HEAD_DATA_LEN, bytes);
	ok = pwrite(fd, h, hb, 0) == (ssize_t)hb;
	if (!ok && errno == 0)
		errno = ENOSPC;
	free(h);
	return ok;
}

/* A region file unanswered for this long was left by a dead client. */
#define SWEEP_AGE_S 600

/* A client killed between making a region and the listener's answer
 * leaves its file named (sparse: a page or two). The first region a
 * process makes removes those of processes gone. */
static void
sweep_dead(void)
{
	DIR *dir = opendir(SHM_DIR);
	struct dirent *d;

	if (dir == NULL)
		return;
	while ((d = readdir(dir)) != NULL) {
		struct stat st;
		long pid;
		char *end;

		if (strncmp(d->d_name, SHM_PREFIX, strlen(SHM_PREFIX)) != 0 ||
		    !name_ok((const uint8_t *)d->d_name, strlen(d->d_name)))
			continue;
		pid = strtol(d->d_name + strlen(SHM_PREFIX), &end, 10);
		if (pid <= 0 || *end != '-' || kill((pid_t)pid, 0) == 0 ||
		    errno != ESRCH)
			continue;
		/* A pid of another pid namespace sharing /dev/shm (containers
		 * of one pod) looks gone too: only files a live client would
		 * long have had answered (its name is removed then) go. */
		if (fstatat(dirfd(dir), d->d_name, &st, AT_SYMLINK_NOFOLLOW) !=
			0 ||
		    st.st_mtime > time(NULL) - SWEEP_AGE_S)
			continue;
		unlinkat(dirfd(dir), d->d_name, 0);
	}
	closedir(dir);
}

static pthread_once_t sweep_once = PTHREAD_ONCE_INIT;

cachew_err
cwi_nng_shm_create(cwi_shm **out, size_t bytes)
{
	cwi_shm *r = shm_new(false);
	uint8_t id[8];
	size_t hb = head_bytes(SHM_SLOTS);
	int fd;

	*out = NULL;
	if (r == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	pthread_once(&sweep_once, sweep_dead);
	if (bytes < SHM_MIN_DATA)
		bytes = SHM_MIN_DATA;
	if (bytes > SHM_MAX_DATA)
		bytes = SHM_MAX_DATA;
	bytes = round_up(bytes, SHM_ALIGN);
	random_bytes(id, sizeof(id));
	random_bytes(r->nonce, sizeof(r->nonce));
	snprintf(r->name, sizeof(r->name), SHM_DIR SHM_PREFIX "%d-%016llx",
	    (int)getpid(), (unsigned long long)cwi_nng_get_u64(id));
	fd = open(r->name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
	    0600);
	if (fd < 0) {
		cachew_err rv = cwi_fail(CACHEW_EIO, "%s: %s", r->name,
		    strerror(errno));
		shm_free(r);
		return rv;
	}
	r->named = true;
	r->map_len = hb + bytes;
	/* Sparse: pages exist once the server writes a block there. The
	 * head is written, not stored through the mapping: a full /dev/shm
	 * (a container's 64 MB) is then ENOSPC here, not SIGBUS later. */
	if (ftruncate(fd, (off_t)r->map_len) != 0 ||
	    !write_head(fd, r->nonce, hb, bytes) ||
	    (r->map = mmap(NULL, r->map_len, PROT_READ | PROT_WRITE,
		 MAP_SHARED, fd, 0)) == MAP_FAILED) {
		cachew_err rv = cwi_fail(CACHEW_EIO, "%s: %s", r->name,
		    strerror(errno));
		r->map = NULL;
		close(fd);
		shm_free(r);
		return rv;
	}
	close(fd);
	r->slots = calloc(SHM_SLOTS, sizeof(*r->slots));
	if (r->slots == NULL) {
		shm_free(r);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	for (uint32_t i = 0; i < SHM_SLOTS; i++) {
		r->slots[i].r = r;
		r->slots[i].slot = i;
	}
	shm_layout(r, SHM_SLOTS, hb, bytes);
	r->pid = getpid();
	*out = r;
	return CACHEW_OK;
}

size_t
cwi_nng_shm_hello(const cwi_shm *r, uint8_t *buf)
{
	size_t nlen = strlen(r->name) - strlen(SHM_DIR);

	buf[0] = (uint8_t)nlen;
	memcpy(buf + 1, r->name + strlen(SHM_DIR), nlen);
	cwi_nng_put_u64(buf + 1 + nlen, r->map_len);
	memcpy(buf + 1 + nlen + 8, r->nonce, SHM_NONCE);
	return HELLO_FIXED + nlen;
}

void
cwi_nng_shm_unlink(cwi_shm *r)
{
	if (r != NULL && r->named) {
		unlink(r->name);
		r->named = false;
	}
}

/* Whether name (n bytes) is one a client makes: cachew-<pid>-<hex>. */
static bool
name_ok(const uint8_t *name, size_t n)
{
	size_t pre = strlen(SHM_PREFIX);

	if (n <= pre || n > SHM_NAME_MAX - strlen(SHM_DIR) ||
	    memcmp(name, SHM_PREFIX, pre) != 0)
		return false;
	for (size_t i = pre; i < n; i++)
		if (!((name[i] >= '0' && name[i] <= '9') ||
			(name[i] >= 'a' && name[i] <= 'f') || name[i] == '-'))
			return false;
	return true;
}

cachew_err
cwi_nng_shm_open(cwi_shm **out, const uint8_t *hello, size_t len)
{
	cwi_shm *r;
	struct stat st;
	uint64_t size, data_off, data_len;
	uint8_t head[HEAD_FLAGS];
	uint32_t nslots;
	size_t nlen;
	int fd;

	*out = NULL;
	if (len < HELLO_FIXED || (nlen = hello[0]) != len - HELLO_FIXED ||
	    !name_ok(hello + 1, nlen))
		return cwi_fail(CACHEW_EPROTO, "malformed shared memory hello "
					       "(%zu bytes)", len);
	size = cwi_nng_get_u64(hello + 1 + nlen);
	if ((r = shm_new(true)) == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	snprintf(r->name, sizeof(r->name), SHM_DIR "%.*s", (int)nlen,
	    (const char *)hello + 1);
	fd = open(r->name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		cachew_err rv = cwi_fail(CACHEW_ENOENT, "%s: %s (another host?)",
		    r->name, strerror(errno));
		shm_free(r);
		return rv;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
	    st.st_uid != geteuid() || (uint64_t)st.st_size != size ||
	    size < HEAD_FLAGS || size > SHM_MAX_DATA + head_bytes(SHM_SLOTS)) {
		cachew_err rv = cwi_fail(CACHEW_EPERM, "%s: not a region "
		    "of this user of %llu bytes", r->name,
		    (unsigned long long)size);
		close(fd);
		shm_free(r);
		return rv;
	}
	/* The server never maps the region: a client that shrinks the file
	 * afterwards would make a store through a mapping raise SIGBUS in
	 * the worker of every job. The flags are read and written with
	 * pread and pwrite, the blocks with pwritev. */
	r->fd = fd;
	/* The head is the client's: read it once, check it (no sum that can
	 * wrap), keep our own copy of the layout. */
	if (pread(fd, head, sizeof(head), 0) != (ssize_t)sizeof(head)) {
		cachew_err rv = cwi_fail(CACHEW_EIO, "%s: reading its head: %s",
		    r->name, strerror(errno));
		shm_free(r);
		return rv;
	}
	nslots = cwi_nng_get_u32(head + HEAD_NSLOTS);
	data_off = cwi_nng_get_u64(head + HEAD_DATA_OFF);
	data_len = cwi_nng_get_u64(head + HEAD_DATA_LEN);
	if (memcmp(head + HEAD_MAGIC, shm_magic, sizeof(shm_magic)) != 0 ||
	    memcmp(head + HEAD_NONCE, hello + 1 + nlen + 8, SHM_NONCE) != 0 ||
	    nslots == 0 || nslots > 4096 || data_off != head_bytes(nslots) ||
	    data_off >= size || data_len != size - data_off ||
	    data_len < SHM_MIN_DATA) {
		cachew_err rv = cwi_fail(CACHEW_EPERM, "%s: not the region "
		    "the hello names (its head differs)", r->name);
		shm_free(r);
		return rv;
	}
	r->blocks = calloc(nslots, sizeof(*r->blocks));
	r->live = calloc(nslots, sizeof(*r->live));
	r->order = calloc(nslots, sizeof(*r->order));
	r->seen = calloc(nslots, sizeof(*r->seen));
	if (r->blocks == NULL || r->live == NULL || r->order == NULL ||
	    r->seen == NULL) {
		shm_free(r);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	shm_layout(r, nslots, (size_t)data_off, (size_t)data_len);
	/* Nobody else opens it; the client removes the name too. */
	unlink(r->name);
	*out = r;
	return CACHEW_OK;
}

/* A slot's flag: the client stores through its mapping, the server
 * (which maps nothing) with pwrite. A failed write leaves 1 (in use,
 * never reused) or 0 before the block frame is sent: either is safe. */
static void
flag_store(cwi_shm *r, uint32_t slot, uint32_t v)
{
	if (!r->server) {
		atomic_store_explicit(&r->flags[slot], v,
		    memory_order_release);
		return;
	}
	(void)!pwrite(r->fd, &v, sizeof(v),
	    (off_t)(HEAD_FLAGS + (size_t)slot * sizeof(v)));
}

/* Where the room a block takes ends (its length aligned). */
static size_t
block_end(const shm_block *b)
{
	return b->off + round_up(b->len, SHM_ALIGN);
}

static int
by_offset(const void *a, const void *b)
{
	const shm_block *x = a, *y = b;

	return x->off < y->off ? -1 : x->off > y->off;
}

/* Reads every flag in one call (the server maps nothing) and forgets the
 * live blocks the client freed (flag 0). False when the flags cannot be
 * read: nothing is then given out. (r->mtx held) */
static bool
reclaim_locked(cwi_shm *r)
{
	size_t bytes = (size_t)r->nslots * sizeof(uint32_t);

	if (pread(r->fd, r->seen, bytes, HEAD_FLAGS) != (ssize_t)bytes)
		return false;
	for (uint32_t i = 0; i < r->nslots; i++)
		if (r->live[i] && r->seen[i] == 0)
			r->live[i] = false;
	return true;
}

/* After a burst the region keeps the pages written (a file's pages stay
 * until it goes): those past end (the end of the last block in use) are
 * given back when they are more than TRIM_SLACK, so a link holds about
 * the most its client held at once. (r->mtx held) */
static void
trim_locked(cwi_shm *r, size_t end)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	end = round_up(end, page);
	if (r->touched > end + TRIM_SLACK &&
	    fallocate(r->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		(off_t)(r->data_off + end), (off_t)(r->touched - end)) == 0)
		r->touched = end;
}

/* A block of len bytes in the lowest gap that fits it, or false. The
 * client frees in any order (a partial batch may wait long for the batch
 * it is stitched to): first fit by offset keeps a held block from pinning
 * the room after it. (r->mtx held) */
static bool
alloc_locked(cwi_shm *r, size_t len, shm_block *out)
{
	size_t need = round_up(len, SHM_ALIGN), off = 0, end;
	uint32_t n = 0, slot = r->nslots;

	if (need > r->data_len || !reclaim_locked(r))
		return false;
	/* A free slot (rotating, so a slot's flag is not rewritten at once
	 * after its release) and the blocks in use. A flag read 1 on a slot
	 * not given out (a failed write) keeps that slot out of use. */
	for (uint32_t i = 0; i < r->nslots; i++) {
		uint32_t k = (r->next_slot + i) % r->nslots;
		if (r->live[k])
			r->order[n++] = r->blocks[k];
		else if (slot == r->nslots && r->seen[k] == 0)
			slot = k;
	}
	if (slot == r->nslots)
		return false;
	qsort(r->order, n, sizeof(*r->order), by_offset);
	/* The lowest gap of need bytes; off: the end of the blocks below. */
	uint32_t i = 0;
	for (; i < n && r->order[i].off < off + need; i++)
		if (block_end(&r->order[i]) > off)
			off = block_end(&r->order[i]);
	if (off > r->data_len || need > r->data_len - off)
		return false;
	/* The end of the blocks in use, this one included (the trim's
	 * bound). */
	end = off + need;
	for (; i < n; i++)
		if (block_end(&r->order[i]) > end)
			end = block_end(&r->order[i]);
	out->slot = slot;
	out->off = off;
	out->len = len;
	r->blocks[slot] = *out;
	r->live[slot] = true;
	r->next_slot = (slot + 1) % r->nslots;
	if (off + need > r->touched)
		r->touched = off + need;
	flag_store(r, slot, 1);
	if (++r->allocs == TRIM_EVERY) {
		r->allocs = 0;
		trim_locked(r, end);
	}
	return true;
}

/* Writes the bytes of t after skip into the file at off, in calls of at
 * most 64 pieces. False on a failure (ENOSPC: /dev/shm is full). */
static bool
write_block(cwi_shm *r, const txmsg *t, size_t skip, size_t off)
{
	struct iovec v[64];
	unsigned i = 0;
	size_t at = r->data_off + off;

	while (i < t->niov) {
		unsigned n = 0;
		size_t want = 0;
		ssize_t got;

		for (; i < t->niov && n < 64; i++) {
			size_t len = t->iov[i].iov_len;
			if (skip >= len) {
				skip -= len;
				continue;
			}
			v[n].iov_base = (uint8_t *)t->iov[i].iov_buf + skip;
			v[n].iov_len = len - skip;
			want += len - skip;
			skip = 0;
			n++;
		}
		if (n == 0)
			break;
		got = pwritev(r->fd, v, (int)n, (off_t)at);
		if (got != (ssize_t)want) {
			/* tmpfs writes all of it or fails; anything else is
			 * a failure too */
			return false;
		}
		at += want;
	}
	return true;
}

cachew_err
cwi_nng_shm_pack(cwi_shm *r, bool ipc, const txmsg *t, size_t min_len,
    txmsg **small)
{
	size_t pre = cwi_nng_sp_prefix(ipc), len = 0;
	const uint8_t *id = (const uint8_t *)t->g.sb.data + pre;
	size_t idlen = cwi_nng_backtrace_len(id, t->g.sb.len - pre);
	uint8_t desc[SHM_DESC];
	shm_block b;
	cachew_err rv;
	bool ok;

	*small = NULL;
	for (unsigned i = 0; i < t->niov; i++)
		len += t->iov[i].iov_len;
	if (len < pre + min_len || idlen == 0)
		return CACHEW_OK;
	len -= pre;
	pthread_mutex_lock(&r->mtx);
	ok = alloc_locked(r, len, &b);
	pthread_mutex_unlock(&r->mtx);
	if (!ok)
		return CACHEW_OK;
	/* Written, not stored through the mapping: a full /dev/shm fails
	 * the write (the reply then takes the socket) instead of raising
	 * SIGBUS. One copy, by the kernel, from where the payloads lie. */
	if (!write_block(r, t, pre, b.off)) {
		flag_store(r, b.slot, 0);
		return CACHEW_OK;
	}
	cwi_nng_put_u32(desc, b.slot);
	cwi_nng_put_u64(desc + 4, b.off);
	cwi_nng_put_u64(desc + 12, b.len);
	/* The block starts with the request id (or backtrace), as the
	 * socket's message would; the block frame carries it too. */
	rv = cwi_nng_tx_build_ctl(small, ipc, id, idlen, FRAME_KIND_SHM_BLOCK,
	    desc, sizeof(desc));
	if (rv != CACHEW_OK) {
		flag_store(r, b.slot, 0);
		return rv;
	}
	return CACHEW_OK;
}

static void
block_free(void *ctx, void *data)
{
	shm_slot *s = ctx;
	cwi_shm *r = s->r;

	(void)data;
	if (getpid() == r->pid)
		atomic_store_explicit(&r->flags[s->slot], 0,
		    memory_order_release);
	cwi_nng_shm_unref(r);
}

cachew_err
cwi_nng_shm_block(cwi_shm *r, const uint8_t *desc, size_t len,
    size_t max_len, cwi_buffer **out)
{
	uint32_t slot;
	uint64_t off, blen;
	cachew_err rv;

	*out = NULL;
	if (r == NULL || r->server)
		return cwi_fail(CACHEW_EPROTO, "a shared memory block on a link "
					       "that offered none");
	if (len != SHM_DESC)
		return cwi_fail(CACHEW_EPROTO, "shared memory block frame of "
					       "%zu bytes", len);
	slot = cwi_nng_get_u32(desc);
	off = cwi_nng_get_u64(desc + 4);
	blen = cwi_nng_get_u64(desc + 12);
	if (slot >= r->nslots || off % SHM_ALIGN != 0 || off > r->data_len ||
	    blen > r->data_len - off || blen > max_len ||
	    blen < SP_ID_BYTES + FRAME_HEAD)
		return cwi_fail(CACHEW_EPROTO, "shared memory block (slot %u, "
		    "%llu bytes at %llu) outside the region of %zu bytes",
		    slot, (unsigned long long)blen, (unsigned long long)off,
		    r->data_len);
	if (atomic_load_explicit(&r->flags[slot], memory_order_acquire) != 1)
		return cwi_fail(CACHEW_EPROTO, "shared memory block in slot %u "
					       "that is not in use", slot);
	rv = cwi_buffer_wrap(out, r->data + off, (size_t)blen, block_free,
	    &r->slots[slot]);
	if (rv != CACHEW_OK) {
		/* Nobody will read it: the block goes back at once. */
		flag_store(r, slot, 0);
		return rv;
	}
	atomic_fetch_add(&r->refs, 1);
	atomic_fetch_add_explicit(&shm_unpacked, 1, memory_order_relaxed);
	return CACHEW_OK;
}

uint64_t
cwi_nng_shm_received(void)
{
	return atomic_load(&shm_unpacked);
}
