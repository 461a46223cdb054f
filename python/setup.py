"""Builds the cachew package: the extension cachew._cachew (src/pycachew.c)
linked statically with the repository's libcachew.a, and the pure-Python
modules of cachew/.

    make python                                  # in place, for the tests
    pip install --no-build-isolation ./python    # into an interpreter

Nothing is downloaded: the build needs Debian's python3-dev and
python3-setuptools, and the C library's own dependencies (.ci/deps.sh).
The library is built first (make lib) unless CACHEW_BUILD names a build
directory that already holds libcachew.a. The link flags are the
Makefile's DEP_LIBS, read from it so that the two never disagree.
"""
import os
import re
import subprocess
import sys

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.path.abspath(os.environ.get("CACHEW_BUILD", os.path.join(ROOT, "build")))
ARCHIVE = os.path.join(BUILD, "libcachew.a")


def makefile_libs():
    """The -l flags of the Makefile's DEP_LIBS."""
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^DEP_LIBS\s*:=\s*(.*)$", line)
            if m:
                return [w[2:] for w in m.group(1).split() if w.startswith("-l")]
    sys.exit("setup.py: no DEP_LIBS line in %s/Makefile" % ROOT)


def version():
    with open(os.path.join(ROOT, "include", "cachew.h"), encoding="utf-8") as f:
        m = re.search(r'#define CACHEW_VERSION_STRING "([^"]+)"', f.read())
    return m.group(1) if m else "0"


def ensure_library():
    if os.path.exists(ARCHIVE) and "CACHEW_BUILD" in os.environ:
        return
    # make is incremental: a no-op when the archive is up to date.
    rv = subprocess.call(["make", "-C", ROOT, "BUILD=" + BUILD, "lib"])
    if rv != 0 or not os.path.exists(ARCHIVE):
        sys.exit("setup.py: could not build %s (make lib)" % ARCHIVE)


if any(a in sys.argv for a in ("build", "build_ext", "install", "bdist_wheel", "develop", "editable_wheel")):
    ensure_library()

setup(
    name="cachew",
    version=version(),
    description="ML input-data processing as a library and as a service",
    packages=["cachew"],
    package_data={"cachew": ["*.pyi", "py.typed"]},
    ext_modules=[
        Extension(
            "cachew._cachew",
            sources=[os.path.join("src", f) for f in (
                "pycachew.c", "pycachew_tensor.c", "pycachew_iter.c", "pycachew_log.c")],
            include_dirs=[os.path.join(ROOT, "include")],
            extra_objects=[ARCHIVE],
            libraries=makefile_libs(),
            extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
            depends=[ARCHIVE, os.path.join(ROOT, "include", "cachew.h"),
                     os.path.join("src", "pycachew.h")],
        )
    ],
    python_requires=">=3.9",
)
