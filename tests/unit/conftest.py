"""Fixtures of the store unit tests: a fresh store directory and an open store per test."""
import os

import pytest

import snapstore


@pytest.fixture
def store_path(tmp_path):
    return os.path.join(str(tmp_path), "store")


@pytest.fixture
def store(store_path):
    s = snapstore.open(store_path, durability="none")
    try:
        yield s
    finally:
        s.close()
