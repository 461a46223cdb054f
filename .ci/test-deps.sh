#!/bin/sh
# Installs what the test suites need beyond the build dependencies, and
# says what it does. Idempotent and quick once done:
#   - the openssl command, which makes the TLS tests' certificates at
#     test time (a CA, certificates it signs, expired ones): required.
#   - s3rver (npm), the S3-compatible server of the io suite's end-to-end
#     S3 tests, into $CACHEW_NPM_DIR (default build/npm). Without it those
#     tests skip with a printed reason; nothing fails for its absence.
#   - gnuplot (gnuplot-nox), which `cachew sim --plot` runs to draw PNGs:
#     without it the sim suite's PNG test skips with a printed reason.
#   - promtool (Debian's prometheus package), with which the cluster suite
#     checks the daemons' /metrics: without it that check skips.
#   - man and groff (man-db, which brings groff-base), with which the cli
#     suite renders the man pages (man/): without them that check skips.
# The tests find it at $CACHEW_NPM_DIR/node_modules/.bin/s3rver.
set -u
cd "$(dirname "$0")/.."
if command -v gnuplot >/dev/null 2>&1; then
	echo "test-deps: gnuplot present ($(command -v gnuplot))"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "test-deps: installing gnuplot (apt-get install -y gnuplot-nox)"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends gnuplot-nox >/dev/null 2>&1 ||
		echo "test-deps: gnuplot unavailable: the plot test will skip"
else
	echo "test-deps: gnuplot not found: the plot test will skip (as root: apt-get install -y gnuplot-nox)"
fi
if command -v promtool >/dev/null 2>&1; then
	echo "test-deps: promtool present ($(command -v promtool))"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "test-deps: installing promtool (apt-get install -y prometheus)"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends prometheus >/dev/null 2>&1 ||
		echo "test-deps: prometheus unavailable: the /metrics format check will skip"
else
	echo "test-deps: promtool not found: the /metrics format check will skip (as root: apt-get install -y prometheus)"
fi
if command -v man >/dev/null 2>&1 && command -v groff >/dev/null 2>&1; then
	echo "test-deps: man and groff present ($(command -v man))"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "test-deps: installing man and groff (apt-get install -y man-db groff-base)"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends man-db groff-base >/dev/null 2>&1 ||
		echo "test-deps: man-db unavailable: the man page check will skip"
else
	echo "test-deps: man or groff not found: the man page check will skip (as root: apt-get install -y man-db groff-base)"
fi
if ! command -v openssl >/dev/null 2>&1; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "test-deps: installing openssl (apt-get install -y openssl)"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends openssl >/dev/null 2>&1 ||
			{ echo "test-deps: cannot install openssl: the TLS tests will fail" >&2; exit 1; }
	else
		echo "test-deps: openssl not found: run as root: apt-get install -y openssl" >&2
		exit 1
	fi
else
	echo "test-deps: openssl present ($(command -v openssl))"
fi
dir=${CACHEW_NPM_DIR:-build/npm}
bin="$dir/node_modules/.bin/s3rver"
if [ -x "$bin" ]; then
	echo "test-deps: s3rver present ($bin)"
	exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "test-deps: installing npm (apt-get install -y npm)"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends npm >/dev/null 2>&1 ||
			{ echo "test-deps: npm unavailable: S3 end-to-end tests will skip"; exit 0; }
	else
		echo "test-deps: npm not found: S3 end-to-end tests will skip"
		exit 0
	fi
fi
mkdir -p "$dir"
echo "test-deps: npm install --prefix $dir s3rver@3"
if npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
	s3rver@3 >"$dir/install.log" 2>&1; then
	echo "test-deps: s3rver installed ($bin)"
else
	echo "test-deps: npm install failed (see $dir/install.log): S3 end-to-end tests will skip"
fi
exit 0
