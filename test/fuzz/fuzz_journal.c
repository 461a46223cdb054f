/*
 * fuzz_journal.c - the journal's readers (src/core/journal.h) over
 * hostile bytes: the input is scanned as a log segment (as the last one,
 * where a torn tail is allowed, and as one followed by another) and
 * parsed as a snapshot.
 *
 * A scan must end in CACHEW_OK or in CACHEW_ECORRUPT / CACHEW_ENOTSUP
 * with a message naming the file and a byte offset. A scan that succeeds
 * must deliver consecutive LSNs from the header's first, each payload
 * inside the input (every byte is read, so a sanitizer sees a slice that
 * lies), and account for every byte: verified records, then the torn
 * tail. The input is also tried with its checksums recomputed, so that
 * the fuzzer reaches the length, sequence and tail rules past them.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/core/crc32c.h"
#include "../../src/core/journal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct delivered {
	const uint8_t *lo, *hi;
	uint64_t next;
	uint64_t records;
} delivered;

static void
must(bool ok)
{
	if (!ok)
		abort();
}

static cachew_err
on_record(void *ctx, uint64_t lsn, const void *payload, size_t len)
{
	delivered *d = ctx;
	const uint8_t *p = payload;
	volatile uint8_t sum = 0;

	must(lsn == d->next);
	must(len <= CWI_JOURNAL_MAX_RECORD);
	must(p >= d->lo && p <= d->hi && len <= (size_t)(d->hi - p));
	for (size_t i = 0; i < len; i++)
		sum ^= p[i];
	(void)sum;
	d->next++;
	d->records++;
	return CACHEW_OK;
}

static void
failed_well(cachew_err rv, const char *name)
{
	const char *m = cachew_errmsg();

	must(rv == CACHEW_ECORRUPT || rv == CACHEW_ENOTSUP);
	must(strncmp(m, "journal: ", 9) == 0 && strstr(m, name) != NULL &&
	    strstr(m, " at byte ") != NULL);
}

static void
scan(const uint8_t *data, size_t size, bool last)
{
	cwi_journal_segment_scan sc;
	delivered d = {data, data + size, 0, 0};
	cachew_err rv;

	/* The first LSN is known only from the header: peek it when the
	 * header verifies, through a scan without a callback. */
	rv = cwi_journal_segment_scan_image(
	    "fuzz-segment", data, size, last, 0, NULL, NULL, &sc);
	if (rv != CACHEW_OK) {
		failed_well(rv, "fuzz-segment");
		return;
	}
	d.next = sc.first_lsn;
	must(cwi_journal_segment_scan_image("fuzz-segment", data, size, last,
		 0, on_record, &d, &sc) == CACHEW_OK);
	must(d.records == sc.records);
	must(sc.next_lsn == sc.first_lsn + sc.records);
	must(sc.end >= CWI_JOURNAL_SEGMENT_HEADER && sc.end <= size);
	must(sc.end + sc.torn_bytes == size);
	must(last || sc.torn_bytes == 0);
}

static void
snapshot(const uint8_t *data, size_t size)
{
	uint64_t lineage, lsn;
	const uint8_t *payload;
	size_t len;
	volatile uint8_t sum = 0;
	cachew_err rv = cwi_journal_snapshot_parse_image(
	    "fuzz-snapshot", data, size, &lineage, &lsn, &payload, &len);

	if (rv != CACHEW_OK) {
		failed_well(rv, "fuzz-snapshot");
		return;
	}
	must(lineage != 0);
	must(payload == data + CWI_JOURNAL_SNAPSHOT_HEADER &&
	    len + CWI_JOURNAL_SNAPSHOT_HEADER + 4 == size);
	for (size_t i = 0; i < len; i++)
		sum ^= payload[i];
	(void)sum;
}

static void
put32(uint8_t *p, uint32_t v)
{
	for (unsigned i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t
get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	    (uint32_t)p[3] << 24;
}

/* The segment with a valid header and every record's checksums right
 * (lengths and LSNs as the input has them). */
static void
seal_segment(uint8_t *b, size_t size)
{
	size_t off = CWI_JOURNAL_SEGMENT_HEADER;

	memcpy(b, "CWJL", 4);
	put32(b + 4, CWI_JOURNAL_FORMAT_VERSION);
	put32(b + 24, 0);
	put32(b + 28, cwi_crc32c(0, b, 28));
	while (size - off >= 16) {
		uint32_t len = get32(b + off);
		put32(b + off + 12, cwi_crc32c(0, b + off, 12));
		if (len > size - off - 16 || size - off - 16 - len < 4)
			break;
		put32(b + off + 16 + len, cwi_crc32c(0, b + off + 16, len));
		off += 20 + (size_t)len;
	}
}

static void
seal_snapshot(uint8_t *b, size_t size)
{
	size_t len = size - CWI_JOURNAL_SNAPSHOT_HEADER - 4;

	memcpy(b, "CWJS", 4);
	put32(b + 4, CWI_JOURNAL_FORMAT_VERSION);
	put32(b + 24, (uint32_t)len);
	put32(b + 28, (uint32_t)((uint64_t)len >> 32));
	put32(b + 32, 0);
	put32(b + 36, cwi_crc32c(0, b, 36));
	put32(b + 40 + len, cwi_crc32c(0, b + 40, len));
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *b;

	scan(data, size, true);
	scan(data, size, false);
	snapshot(data, size);
	if (size < CWI_JOURNAL_SEGMENT_HEADER || size > (1u << 20))
		return 0;
	b = malloc(size);
	if (b == NULL)
		return 0;
	memcpy(b, data, size);
	seal_segment(b, size);
	scan(b, size, true);
	scan(b, size, false);
	if (size >= CWI_JOURNAL_SNAPSHOT_HEADER + 4) {
		memcpy(b, data, size);
		seal_snapshot(b, size);
		snapshot(b, size);
	}
	free(b);
	return 0;
}
