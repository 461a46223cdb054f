#!/bin/sh
# Checks the build dependencies (Debian 12 packages) and installs what is
# missing when run as root with apt-get; otherwise prints the exact command
# and fails. BENCH_DEPS=1 adds the benchmark peers (PyTorch, numpy).
set -u
missing=""
need() { # need PACKAGE CHECK-COMMAND...
	pkg=$1; shift
	"$@" >/dev/null 2>&1 || missing="$missing $pkg"
}
has_header() { printf '#include <%s>\n' "$1" | ${CC:-cc} -E -x c - >/dev/null 2>&1; }

need pkg-config        command -v pkg-config
need make              command -v make
need gcc               command -v ${CC:-cc}
need libnng-dev        has_header nng/nng.h
# nng's TLS engine; transports/nng/nng_tls.c calls it directly too.
need libmbedtls-dev    has_header mbedtls/ssl.h
# The TLS engine cachew gives nng (transports/nng/nng_tls_ossl.c).
need libssl-dev        has_header openssl/ssl.h
need libmsgpack-dev    pkg-config --exists msgpack
need libcurl4-openssl-dev pkg-config --exists libcurl
need libzstd-dev       pkg-config --exists libzstd
need check             pkg-config --exists check
need libturbojpeg0-dev pkg-config --exists libturbojpeg
need libxxhash-dev     pkg-config --exists libxxhash
need libjpeg62-turbo-dev pkg-config --exists libjpeg
need zlib1g-dev        pkg-config --exists zlib
# Outside formats: GCS listings and Kubernetes replies (JSON, io_json.c),
# S3 listings (XML, io_s3.c).
need libjansson-dev    pkg-config --exists jansson
need libexpat1-dev     pkg-config --exists expat
# The layer check (test/module_graph.py) and the tests' reference
# implementations and servers (test/data, test/servers).
need python3           test -x /usr/bin/python3
# The Python package (python/, `make python`, its pytest suite in `make
# test`), built and tested with Debian's interpreter.
need python3-dev        /usr/bin/python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'
need python3-setuptools /usr/bin/python3 -c 'import setuptools'
need python3-pytest     /usr/bin/python3 -c 'import pytest'
need python3-numpy      /usr/bin/python3 -c 'import numpy'
if [ "${BENCH_DEPS:-0}" = 1 ]; then
	need python3-torch       /usr/bin/python3 -c 'import torch'
	need python3-torchvision /usr/bin/python3 -c 'import torchvision'
	need time                test -x /usr/bin/time
fi

[ -z "$missing" ] && exit 0
cmd="apt-get install -y --no-install-recommends$missing"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "deps: installing$missing"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends $missing >/dev/null \
		|| { echo "deps: failed: $cmd" >&2; exit 1; }
	exit 0
fi
echo "deps: missing packages:$missing" >&2
echo "deps: run as root: $cmd" >&2
exit 1
