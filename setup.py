"""Build glue: compiles csrc/ into snapstore._ffi through cffi (see csrc/build_ffi.py)."""
from setuptools import setup

setup(cffi_modules=["csrc/build_ffi.py:ffibuilder"])
