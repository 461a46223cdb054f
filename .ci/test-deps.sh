#!/bin/sh
# Installs what the test suites need beyond the build dependencies, and
# says what it does. Idempotent and quick once done:
#   - the openssl command, which makes the TLS tests' certificates at
#     test time (a CA, certificates it signs, expired ones): required.
#   - python3-torch, for the Python package's torch tests (they skip
#     without it);
#   - s3rver (npm), the S3-compatible server of the io suite's end-to-end
#     S3 tests, into $CACHEW_NPM_DIR (default build/npm). Without it those
#     tests skip with a printed reason; nothing fails for its absence.
#   - gnuplot (gnuplot-nox), which `cachew sim --plot` runs to draw PNGs:
#     without it the sim suite's PNG test skips with a printed reason.
#   - promtool (Debian's prometheus package), with which the cluster suite
#     checks the daemons' /metrics: without it that check skips.
#   - man and groff (man-db, which brings groff-base), with which the cli
#     suite renders the man pages (man/): without them that check skips.
#   - tmux, the terminal in which the cluster suite drives `cachew top`:
#     without it that test skips.
# The tests find it at $CACHEW_NPM_DIR/node_modules/.bin/s3rver.
set -u
cd "$(dirname "$0")/.."
# optional TOOL "PACKAGES" "WHAT SKIPS": a tool some tests use and skip
# without, saying so; installed with apt-get when run as root.
optional() {
	if command -v "$1" >/dev/null 2>&1; then
		echo "test-deps: $1 present ($(command -v "$1"))"
	elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "test-deps: installing $1 (apt-get install -y $2)"
		# shellcheck disable=SC2086 # $2 is a list of packages
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends $2 >/dev/null 2>&1 ||
			echo "test-deps: $2 unavailable: $3 will skip"
	else
		echo "test-deps: $1 not found: $3 will skip (as root: apt-get install -y $2)"
	fi
}
optional gnuplot gnuplot-nox "the plot test"
optional promtool prometheus "the /metrics format check"
optional man "man-db groff-base" "the man page check"
optional groff groff-base "the man page check"
optional tmux tmux "the cachew top test"
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
# PyTorch for the Python package's torch tests (python/tests/test_torch.py
# and the DLPack tests), which skip with a printed reason without it.
if /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
	echo "test-deps: python3-torch present"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "test-deps: installing python3-torch (apt-get install -y python3-torch)"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends python3-torch >/dev/null 2>&1 ||
		echo "test-deps: python3-torch unavailable: the torch tests will skip"
else
	echo "test-deps: python3-torch not found: the torch tests will skip"
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
