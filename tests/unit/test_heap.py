"""`target.heap`: freed large blocks stay in the heap for reuse, and SPECWIRE_HEAP=system turns that off."""

import json
import os
import platform
import subprocess
import sys

from specwire.target.heap import HEAP_ENV, keep_freed_memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# In a fresh interpreter: set the heap (or not), then malloc and free 64 MB and read how much free memory the
# heap itself still holds (glibc's mallinfo2: fordblks). Served by mmap, the block is unmapped on free.
PROBE = r"""
import ctypes, json
from specwire.target.heap import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

what = keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
block = libc.malloc(64 << 20)
ctypes.memset(block, 1, 64 << 20)
libc.free(block)
print(json.dumps({"what": what, "free_in_heap": libc.mallinfo2().fordblks}))
"""


def _probe(env_value: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != HEAP_ENV}
    if env_value is not None:
        env[HEAP_ENV] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_system_leaves_the_heap_alone(monkeypatch):
    monkeypatch.setenv(HEAP_ENV, "system")
    assert keep_freed_memory() == "system"


def test_freed_large_blocks_stay_in_the_heap():
    if not GLIBC:  # nothing to set there, and the function says so
        assert keep_freed_memory().startswith("unsupported")
        return
    kept, default = _probe(None), _probe("system")
    assert kept["what"] == "reuse" and default["what"] == "system"
    assert kept["free_in_heap"] >= 64 << 20  # the freed block is still the heap's, ready for the next tensor
    assert default["free_in_heap"] < 64 << 20  # glibc's default: mapped for the block, unmapped on free


def test_the_process_entry_points_set_the_heap_for_batch_commands_only():
    """The `specwire` script and `python -m specwire` go through `cli.run`; it sets the heap for the batch
    commands where it measured faster, and `cli.main` as tests call it in-process leaves the heap alone."""
    from importlib.metadata import entry_points
    from pathlib import Path

    import specwire
    from specwire import cli

    assert entry_points(group="console_scripts")["specwire"].value == "specwire.cli:run"
    assert "run()" in (Path(specwire.__file__).parent / "__main__.py").read_text()
    assert cli.REUSE_HEAP_COMMANDS == {"datagen", "selfinstruct", "train"}
    for name in cli.REUSE_HEAP_COMMANDS:  # each is a real subcommand
        assert name in cli.build_parser()._subparsers._group_actions[0].choices


RELEASE_PROBE = r"""
import ctypes, json, os
from specwire.target.heap import keep_freed_memory, release_freed_memory

def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

what = keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
blocks = [libc.malloc(64 << 20) for _ in range(4)]
for b in blocks:
    ctypes.memset(b, 1, 64 << 20)
keep = libc.malloc(1 << 20)  # a live block above them: the freed ones are not at the top of the heap
for b in blocks:
    libc.free(b)
before = rss_mb()
ran = release_freed_memory()
print(json.dumps({"what": what, "ran": ran, "before": before, "after": rss_mb()}))
"""


def test_release_hands_free_heap_pages_back():
    if not GLIBC:
        return  # keep_freed_memory changes nothing there (asserted above), so there is nothing to release
    env = {k: v for k, v in os.environ.items() if k != HEAP_ENV}
    r = json.loads(subprocess.run([sys.executable, "-c", RELEASE_PROBE], env=env, capture_output=True, text=True,
                                  check=True).stdout)
    assert r["what"] == "reuse" and r["ran"]
    assert r["before"] - r["after"] >= 200  # MB: the 256 MB freed below a live block went back to the OS
    env[HEAP_ENV] = "system"
    r = json.loads(subprocess.run([sys.executable, "-c", RELEASE_PROBE], env=env, capture_output=True, text=True,
                                  check=True).stdout)
    assert r["what"] == "system" and not r["ran"]
