"""Command-line options generated from the config dataclasses, so that each default lives once.

Owns: turning a config dataclass's fields into argparse options (flag name, type, default, and the
field's own trailing comment as its help), building the config back from the parsed arguments, and the
options every model-running command shares (`--target`, `--draft`, `--device`, `--dtype`, `--threads`,
`--json`). Does not own any command: those live beside this module, one module per command group.

A field `max_new_tokens: int = 256  # answer length cap` becomes `--max-new-tokens N` with help
"answer length cap (default: 256)". `bool` fields become `--flag/--no-flag`; `tuple[int, ...]` fields
take comma-separated ids ("2,15,27"); `list[str]` fields take one or more values.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import typing
from typing import Any, Iterable, Mapping

from specwire.errors import SpecwireError

_FIELD_LINE = re.compile(r"^\s+(\w+)\s*:[^#]*#\s?(.*)$")


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the comment that ends its line in the class body (the field's one description)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            lines = inspect.getsource(klass).splitlines()
        except (OSError, TypeError):
            continue
        for line in lines:
            m = _FIELD_LINE.match(line)
            if m:
                docs[m.group(1)] = m.group(2).strip()
    return docs


def parse_int_tuple(text: str) -> tuple[int, ...]:
    """'2,15,27' or '[2, 15, 27]' -> (2, 15, 27), with an argparse error on anything else."""
    try:
        return tuple(int(x) for x in text.strip("[] ").replace(" ", "").split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 2,15,27, found {text!r}") from None


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """(the type without Optional, whether None is allowed)."""
    args = typing.get_args(tp)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else tp), True
    return tp, False


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def add_config_options(p: argparse.ArgumentParser, cls: type, *, only: Iterable[str] | None = None,
                       skip: Iterable[str] = (), flags: Mapping[str, str] | None = None,
                       helps: Mapping[str, str] | None = None, choices: Mapping[str, Iterable[Any]] | None = None,
                       positional: Iterable[str] = ()) -> None:
    """Add one option per field of dataclass `cls` (in field order) to parser `p`.

    only/skip select fields; flags renames a field's flag ("data": "--data"); helps adds to or replaces
    a field's comment; choices restricts values; positional turns fields into positional arguments.
    A field without a default becomes a required option.
    """
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    only = set(only) if only is not None else None
    skip, flags, helps, choices, positional = set(skip), dict(flags or {}), dict(helps or {}), dict(choices or {}), set(positional)
    for f in dataclasses.fields(cls):
        if (only is not None and f.name not in only) or f.name in skip or not f.init:
            continue
        base, optional = _unwrap(hints[f.name])
        default = _default(f)
        text = helps.get(f.name, docs.get(f.name, ""))
        kwargs: dict[str, Any] = {}
        origin, args = typing.get_origin(base), typing.get_args(base)
        if base is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif base in (int, float, str):
            kwargs["type"] = base
        elif origin in (tuple, list) and args and args[0] is int:
            kwargs["type"] = parse_int_tuple
            kwargs["metavar"] = "IDS"
        elif origin is list or (origin is typing.Union and list in map(typing.get_origin, args)):
            kwargs["nargs"] = "+"
        elif base is dict or origin is dict:
            kwargs["type"] = json.loads
            kwargs["metavar"] = "JSON"
        else:
            kwargs["type"] = str
        if f.name in choices:
            kwargs["choices"] = list(choices[f.name])
        if f.name in positional:
            p.add_argument(f.name, help=text, **kwargs)
            continue
        flag = flags.get(f.name, "--" + f.name.replace("_", "-"))
        if default is dataclasses.MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = default
            if default is not None and default != "" and "%(default)" not in text:
                shown = ",".join(map(str, default)) if isinstance(default, (tuple, list)) else "%(default)s"
                text = f"{text} (default: {shown})" if text else f"default: {shown}"
        p.add_argument(flag, dest=f.name, help=text or None, **kwargs)


def config_from_args(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """Build `cls` from the parsed options that `add_config_options` added, plus explicit overrides."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.init and hasattr(args, f.name)}
    values.update(overrides)
    try:
        return cls(**values)
    except TypeError as e:  # a required field the parser did not add: a programming error, not a user one
        raise SpecwireError(f"internal: cannot build {cls.__name__} from the command line ({e}).") from None


# ---- the options every model-running command shares --------------------------------------------------

def add_model_options(p: argparse.ArgumentParser, *, target: bool = True, draft: bool = False,
                      linear: bool = False, generation: bool = False) -> None:
    """--target/--draft, --device, --dtype, --threads (and `linear`: the decoding commands' --linear;
    `generation`: the batched-generation commands' --dtype auto)."""
    if target:
        p.add_argument("--target", default="smollm2-135m", help="built-in target name or HF model folder (default: %(default)s)")
    if draft:
        p.add_argument("--draft", default="smollm2-135m-eagle3",
                       help="draft checkpoint folder, a `train --out` folder, or the shipped 'smollm2-135m-eagle3' "
                            "(default: %(default)s)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    if linear:  # a decoding command: the kernel defaults to the fastest batch-invariant one on this machine
        p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                       help="weights dtype; 'auto' (default) picks the fastest whose passes are bitwise invariant on "
                            "this machine: bf16 only where the CPU computes it natively (AMX or AVX512-BF16), "
                            "measured once and cached under $SPECWIRE_HOME/hardware")
    elif generation:  # batched generation: many rows per GEMM, where native bf16 pays off most
        p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                       help="weights dtype; 'auto' (default) is bfloat16 on CUDA or where the CPU computes bf16 "
                            "natively (AMX or AVX512-BF16), else float32. Answers are the target's greedy decoding "
                            "in that dtype")
    else:
        p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                       help="weights dtype (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    if linear:
        p.add_argument("--linear", default="auto", choices=["auto", "torch", "pretransposed", "onednn", "rowdot", "amx"],
                       help="the target's linear layers on CPU: 'torch' keeps nn.Linear; 'pretransposed' stores W.T "
                            "contiguously; 'onednn' hands oneDNN weights reordered once into its own layout (CPU); 'rowdot' (float32 on "
                            "x86-64 with AVX2, bf16 with AVX512-BF16; built with the C compiler on first "
                            "use) computes every row in one fixed order, so it needs no row padding; 'amx' (bf16, a CPU "
                            "with AMX, built the same way) does so on AMX tiles, so a verify pass costs little more "
                            "than a one-token step in its linear layers; 'auto' "
                            "(default) picks with --dtype auto's measurement (every method of a bench run shares "
                            "the same target)")


def add_draft_mode_option(p: argparse.ArgumentParser) -> None:
    """--tree (default) / --chain: how the draft proposes tokens."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tree", dest="tree", action="store_true", default=True, help="tree drafting (default)")
    g.add_argument("--chain", dest="tree", action="store_false", help="chain drafting")


def add_json_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of text")


def emit_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))
