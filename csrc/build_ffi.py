"""cffi builder (API mode, out of line) for snapstore's C core; compiled into snapstore._ffi.

Environment:
  SNAPSTORE_SANITIZE=1   build with AddressSanitizer + UBSan (for `make asan`), -O1 -g.
  SNAPSTORE_CFLAGS       extra compiler flags appended last.
"""
import os
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ["errors.c", "fingerprint.c", "pagediff.c", "gather.c", "fastcdc.c", "uffd.c", "fprefine.c", "bytediff.c", "planes.c",
           "writeback.c", "prefault.c", "chunkread.c", "chunkwrite.c"]
SYSTEM_HEADERS = {"xxhash.h": "libxxhash-dev", "zstd.h": "libzstd-dev"}   # header -> package
LIBRARIES = ["zstd"]


def _find_system_headers() -> None:
    """Stop the build with one clear line when a system header is missing."""
    dirs = ["/usr/include", "/usr/local/include"] + os.environ.get("CPATH", "").split(":")
    for header, package in SYSTEM_HEADERS.items():
        if not any(d and os.path.exists(os.path.join(d, header)) for d in dirs):
            sys.exit(f"snapstore build: {header} not found; install it with: "
                     f"apt-get install {package}")


def _compile_args() -> list:
    if os.environ.get("SNAPSTORE_SANITIZE") == "1":
        args = ["-O1", "-g", "-fno-omit-frame-pointer",
                "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
    else:
        # Portable code the compiler vectorises; XXH3 dispatch is resolved by xxhash itself.
        args = ["-O3"]
    args += ["-std=c11", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"]
    return args + os.environ.get("SNAPSTORE_CFLAGS", "").split()


_find_system_headers()
ffibuilder = FFI()
with open(os.path.join(HERE, "snapstore.cdef")) as f:
    ffibuilder.cdef(f.read())
ffibuilder.set_source(
    "snapstore._ffi",
    '#include "snapstore.h"',
    sources=[os.path.join("csrc", s) for s in SOURCES],
    include_dirs=[HERE],
    libraries=LIBRARIES,
    extra_compile_args=_compile_args(),
    extra_link_args=(["-fsanitize=address,undefined"]
                     if os.environ.get("SNAPSTORE_SANITIZE") == "1" else []),
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
