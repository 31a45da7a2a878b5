"""Safe, atomic file input and output.

Owns: the cache root every cache lives under (`specwire_home`), atomic writes (temp file or folder, then rename;
JSON, text and PNG figures), append-only JSONL logs (one fsynced line per
record; a partial last line left by a crash is cut on resume), JSON reading with clear errors, and
safetensors reading that validates the header before trusting it. Nothing here unpickles: untrusted
files stay data. Does not know what any file means; callers validate fields.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors.torch import load_file, save_file

from specwire.errors import SpecwireError

log = logging.getLogger("specwire")

# A safetensors header larger than this is refused before it is parsed (real headers are kilobytes).
MAX_HEADER_BYTES = 100 * 1024 * 1024
_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8,
}


def specwire_home() -> Path:
    """Cache root (SPECWIRE_HOME, default ~/.cache/specwire)."""
    return Path(os.environ.get("SPECWIRE_HOME", Path.home() / ".cache" / "specwire")).expanduser()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling path; on success rename it onto `path` (file or folder).

    A crash inside the block leaves `path` untouched and removes the temporary.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent)) / "tmp"
    try:
        yield tmp
        if path.is_dir() and not path.is_symlink():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp.parent, ignore_errors=True)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def save_png(fig, path: str | os.PathLike, *, dpi: int | None = None) -> Path:
    """Lay out a matplotlib figure and save it as PNG, atomically; returns the path. The caller closes it."""
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
    return Path(path)


def append_line(path: str | os.PathLike, line: bytes) -> None:
    """Append one newline-terminated record and fsync it: after a crash the file holds whole records
    plus at most one partial last line, which `cut_partial_line` removes."""
    if not line.endswith(b"\n"):
        raise ValueError("append_line: a record must end with a newline")
    with open(path, "ab") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def cut_partial_line(path: str | os.PathLike) -> bytes:
    """Truncate `path` after its last newline (an interrupted append, logged); returns the whole lines."""
    with open(path, "r+b") as f:
        data = f.read()
        keep = data.rfind(b"\n") + 1
        if keep < len(data):
            log.warning("%s: dropping a partial last line (%d bytes) left by an interrupted run", path, len(data) - keep)
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
    return data[:keep]


def read_json(path: str | os.PathLike, *, what: str = "JSON file") -> dict:
    """Read a JSON object, or raise a SpecwireError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise SpecwireError(f"{what} not found: {path}")
    try:
        obj = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecwireError(f"{path}: not valid JSON ({e}).") from None
    if not isinstance(obj, dict):
        raise SpecwireError(f"{path}: expected a JSON object at the top level, found {type(obj).__name__}.")
    return obj


def save_tensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Save tensors as safetensors, atomically. Tensors are made contiguous and unshared."""
    clean = {k: v.detach().contiguous().clone() if v.is_shared() else v.detach().contiguous() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(clean, str(tmp), metadata=metadata)


def safetensors_header(path: str | os.PathLike) -> dict:
    """Read and validate a safetensors header without loading any tensor.

    Refuses a truncated file, a header that claims more bytes than the file holds, and offsets that
    overlap or run past the end. Returns {name: {dtype, shape, data_offsets}} (plus __metadata__).
    """
    path = Path(path)
    if not path.is_file():
        raise SpecwireError(f"safetensors file not found: {path}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise SpecwireError(f"{path}: truncated safetensors file ({size} bytes, no header length).")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise SpecwireError(
                f"{path}: safetensors header claims {n} bytes but the file has {size}; the file is truncated or not safetensors."
            )
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise SpecwireError(f"{path}: safetensors header is not valid JSON; the file is corrupt.") from None
    if not isinstance(header, dict):
        raise SpecwireError(f"{path}: safetensors header is not a JSON object.")
    data_len = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
            numel = 1
            for s in shape:
                numel *= int(s)
            need = numel * _DTYPE_BYTES[dtype]
        except (KeyError, TypeError, ValueError):
            raise SpecwireError(f"{path}: tensor '{name}' has a malformed header entry: {info!r}.") from None
        if end - start != need or end > data_len or start < 0:
            raise SpecwireError(
                f"{path}: tensor '{name}' claims bytes {start}..{end} (shape {shape}, {dtype}) but the data "
                f"section has {data_len} bytes; the file is truncated or corrupt."
            )
    return header


def load_tensors(path: str | os.PathLike, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Load a safetensors file after validating its header."""
    safetensors_header(path)
    try:
        return load_file(str(path), device=str(device))
    except Exception as e:  # safetensors raises its own error types for corrupt data
        raise SpecwireError(f"{path}: could not read safetensors ({e}).") from None


def check_tensors(
    path: str | os.PathLike,
    tensors: dict[str, torch.Tensor],
    expected: dict[str, tuple[int, ...]],
    *,
    optional: frozenset[str] = frozenset(),
) -> None:
    """Check names and shapes of loaded tensors against `expected`; name the file and the tensor."""
    missing = sorted(set(expected) - set(tensors) - optional)
    extra = sorted(set(tensors) - set(expected))
    if missing:
        raise SpecwireError(f"{path}: missing tensors {missing}.")
    if extra:
        raise SpecwireError(f"{path}: unexpected tensors {extra} (is this a checkpoint of another format?).")
    for name, shape in expected.items():
        if name in tensors and tuple(tensors[name].shape) != tuple(shape):
            raise SpecwireError(
                f"{path}: tensor '{name}' has shape {tuple(tensors[name].shape)}, expected {tuple(shape)}."
            )
