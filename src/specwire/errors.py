"""User-facing errors.

`SpecwireError` is the one exception type that means "the user gave us something wrong" (a bad path,
a mismatched wiring, a truncated file). The CLI prints its message on one line and exits with code 2,
without a traceback. Anything else escaping is a bug in specwire and keeps its traceback.
"""

from __future__ import annotations


class SpecwireError(Exception):
    """A user mistake, explained: what was expected, what was found, and the fix."""

    def __init__(self, message: str, *, fix: str | None = None):
        self.fix = fix
        super().__init__(message if fix is None else f"{message} Fix: {fix}")


class WiringMismatch(SpecwireError):
    """Two artefacts disagree on the wiring contract (hidden-state ids, target, tokenizer...)."""
