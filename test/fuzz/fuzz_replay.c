/*
 * fuzz_replay.c - runs a fuzz target over every file of a corpus
 * directory without libFuzzer, so `make check` replays the committed
 * corpora with the ordinary compiler (zstd and OSS-Fuzz practice).
 *
 *   build/fuzz/fuzz_X_replay test/fuzz/corpus/fuzz_X
 *
 * prints "fuzz_X: N inputs replayed" and exits 0; a missing or empty
 * directory replays 0 inputs. A target that finds a bug aborts, which
 * fails the run. Files are replayed in name order, so a failure
 * reproduces the same way every time.
 *
 * main and the fallback target are weak: the Makefile's wildcard also
 * matches this file, and the target built from it alone (fuzz_replay)
 * then links this translation unit twice. In the real fuzz targets the
 * strong LLVMFuzzerTestOneInput (and libFuzzer's main) win.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

__attribute__((weak)) int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	(void)data;
	(void)size;
	return 0;
}

/* Reads a whole regular file; NULL if it cannot be read. */
static uint8_t *
read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	size_t cap = 0, n = 0;

	if (f == NULL)
		return NULL;
	for (;;) {
		if (n == cap) {
			size_t ncap = cap != 0 ? cap * 2 : 4096;
			uint8_t *p = realloc(buf, ncap);
			if (p == NULL) {
				free(buf);
				fclose(f);
				return NULL;
			}
			buf = p;
			cap = ncap;
		}
		size_t got = fread(buf + n, 1, cap - n, f);
		n += got;
		if (got == 0)
			break;
	}
	fclose(f);
	*len = n;
	return buf;
}

static int
name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The target's name: the program name without directory and "_replay". */
static void
target_name(const char *argv0, char *out, size_t cap)
{
	const char *base = strrchr(argv0, '/');
	size_t n;

	base = base != NULL ? base + 1 : argv0;
	n = strlen(base);
	if (n > 7 && strcmp(base + n - 7, "_replay") == 0)
		n -= 7;
	snprintf(out, cap, "%.*s", (int)n, base);
}

__attribute__((weak)) int
main(int argc, char **argv)
{
	char name[256], path[4096];
	char **files = NULL;
	size_t nfiles = 0, cap = 0, replayed = 0;
	struct dirent *de;
	DIR *dir;

	target_name(argc > 0 ? argv[0] : "fuzz", name, sizeof(name));
	dir = argc > 1 ? opendir(argv[1]) : NULL;
	while (dir != NULL && (de = readdir(dir)) != NULL) {
		if (de->d_name[0] == '.')
			continue;
		if (nfiles == cap) {
			cap = cap != 0 ? cap * 2 : 64;
			files = realloc(files, cap * sizeof(*files));
			if (files == NULL) {
				fprintf(stderr, "%s: out of memory\n", name);
				return 1;
			}
		}
		files[nfiles] = strdup(de->d_name);
		if (files[nfiles] == NULL) {
			fprintf(stderr, "%s: out of memory\n", name);
			return 1;
		}
		nfiles++;
	}
	if (dir != NULL)
		closedir(dir);
	if (nfiles > 0)
		qsort(files, nfiles, sizeof(*files), name_cmp);
	for (size_t i = 0; i < nfiles; i++) {
		struct stat st;
		uint8_t *data;
		size_t len = 0;

		snprintf(path, sizeof(path), "%s/%s", argv[1], files[i]);
		free(files[i]);
		if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
			continue;
		data = read_file(path, &len);
		if (data == NULL) {
			fprintf(stderr, "%s: cannot read %s\n", name, path);
			return 1;
		}
		/* An exact-size copy, as libFuzzer passes it, so a
		 * sanitizer sees any read past the end. */
		uint8_t *exact = malloc(len != 0 ? len : 1);
		if (exact == NULL) {
			fprintf(stderr, "%s: out of memory\n", name);
			return 1;
		}
		if (len != 0)
			memcpy(exact, data, len);
		free(data);
		LLVMFuzzerTestOneInput(exact, len);
		free(exact);
		replayed++;
	}
	free(files);
	printf("%s: %zu inputs replayed\n", name, replayed);
	return 0;
}
