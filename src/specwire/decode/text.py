"""Streaming detokenization: generated token ids in, text out piece by piece, exact at the end.

Owns: `TextStream`, the one incremental detokenizer every front end uses (`specwire generate` and
`demo` print its pieces; `specwire serve` sends them as server-sent events), and `tokenizer_decode`, the
decode function both use (special tokens skipped). Does not own decoding tokens (`plain`, `engine`) or
how pieces reach a user (terminal, HTTP).

The text after n tokens is `decode(ids[:n])`. A piece is released only when it can no longer change:
a trailing run of U+FFFD (a multi-byte UTF-8 character whose bytes are split across tokens) is held
back until the next token completes it, and with stop strings the last len(longest stop) - 1 characters
are held back too (a stop string may be starting there). The first occurrence of a stop string ends the
text there (the stop string itself is left out). `finish()` releases the rest, so the pieces joined equal
`text`, which equals `decode(ids)` cut at the stop string. This holds for any decode function whose
output for a prefix of ids is a prefix of its output for all ids, apart from a trailing incomplete
character (byte-level BPE and SentencePiece decoders are; `tokenizer_decode` leaves the tokenizer's
own settings as they are).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

REPLACEMENT = "\ufffd"  # what a decoder shows for the bytes of a character not complete yet


def tokenizer_decode(tokenizer: Any) -> Callable[[list[int]], str]:
    """The decode function of a Hugging Face tokenizer: ids -> text, special tokens skipped."""

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    return decode


class TextStream:
    """Turns generated token ids into released text, exactly as the final text will read.

    `add(token_id)` returns the newly released text ('' when none); `finish()` returns the rest.
    `text` is the text so far (cut at a stop string), `ids` the tokens taken, `stopped` whether a
    stop string was found (then `add` must not be called again: the generation should end).
    """

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()):
        self.decode = decode
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1  # characters a stop string may still claim
        self.ids: list[int] = []
        self.text = ""  # decode(ids), cut at the first stop string
        self.released = 0  # characters of `text` already handed out
        self.stopped = False

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, stop: Sequence[str] = ()) -> "TextStream":
        """A stream over a Hugging Face tokenizer's decode (special tokens skipped)."""
        return cls(tokenizer_decode(tokenizer), stop)

    def add(self, token_id: int) -> str:
        """Take one token; return the newly released text ('' if none). On a stop string, returns the rest."""
        if self.stopped:
            raise RuntimeError("TextStream.add after a stop string: the generation should have ended")
        self.ids.append(int(token_id))
        self.text = self.decode(self.ids)
        if self.stop:
            # nothing released holds a stop string (the hold guarantees it), so search from there on
            hits = [i for i in (self.text.find(s, self.released) for s in self.stop) if i >= 0]
            if hits:
                self.text = self.text[:min(hits)]
                self.stopped = True
                return self._release(len(self.text))
        complete = len(self.text.rstrip(REPLACEMENT))  # a trailing U+FFFD run may be a character cut in half
        return self._release(min(complete, len(self.text) - self.hold))

    def finish(self) -> str:
        """Release everything left (a trailing U+FFFD that no token completed is released as it is)."""
        return self._release(len(self.text))

    def _release(self, end: int) -> str:
        if end <= self.released:
            return ""
        out = self.text[self.released:end]
        self.released = end
        return out
