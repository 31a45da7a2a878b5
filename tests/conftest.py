"""Shared test fixtures; the plain builders they use live in helpers.py (tests import those from there).

Owns: the per-test torch thread count (`_torch_threads`, autouse), the `tiny_target` factory fixture
(arch, seed) -> saved HF folder, and the session-scoped `tiny_llama_target` (a loaded
`specwire.target.load.Target`), and loads the strict-skips plugin. The tiny models are built offline
by `helpers.make_tiny_target_dir` (no hub). Does not test anything itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytest_plugins = ["strict_skips"]  # a skip outside the allow-list fails `make test`

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before helpers (and so transformers) is imported
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from helpers import make_tiny_target_dir  # noqa: E402  (tests/ is on sys.path: this file lives there)

_DEFAULT_THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True)
def _torch_threads(request):
    """One torch thread for fast tests, torch's default for `slow` ones (the built-in target).

    Tiny models are all overhead: with 2+ threads on a shared, busy CPU, OpenMP's spinning makes a
    tiny forward pass 10-20x slower than with one thread. SPECWIRE_TEST_THREADS overrides both.
    """
    n = int(os.environ.get("SPECWIRE_TEST_THREADS", 0)) or (
        _DEFAULT_THREADS if request.node.get_closest_marker("slow") else 1)
    torch.set_num_threads(n)
    yield
    torch.set_num_threads(_DEFAULT_THREADS)


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    """Factory: tiny_target(arch, seed=0, **overrides) -> folder of a saved tiny model (cached per session)."""
    root = tmp_path_factory.mktemp("tiny-targets")

    def factory(arch: str = "llama", seed: int = 0, **overrides) -> Path:
        return make_tiny_target_dir(root, arch, seed=seed, **overrides)

    return factory


@pytest.fixture(scope="session")
def tiny_llama_target(tiny_target):
    """A loaded tiny Llama `Target` on CPU (shared: do not modify it)."""
    from specwire.target.load import load_target

    return load_target(tiny_target("llama"), device="cpu", dtype="float32")
