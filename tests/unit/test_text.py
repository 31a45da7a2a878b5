"""Streaming detokenization (`specwire.decode.text.TextStream`): no half characters, exact at the end.

Uses the tiny byte-level tokenizer of helpers.py (one token per UTF-8 byte), so every multi-byte character
is split across tokens, and a toy decode function for the stop-string rules.
"""

from __future__ import annotations

import pytest

from specwire.decode.text import REPLACEMENT, TextStream, tokenizer_decode

from helpers import feed_stream, tiny_tokenizer, toy_decode


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.mark.parametrize("text", ["plain ascii", "café crème", "中文字符 mixed", "emoji 🙂👍 end", "é", "🙂"])
def test_pieces_never_hold_half_a_character_and_join_to_the_full_decode(tok, text):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.encode())  # one token per byte: multi-byte characters are split
    stream = TextStream.for_tokenizer(tok)
    pieces = feed_stream(stream, ids)
    assert all(REPLACEMENT not in p for p in pieces)
    assert "".join(pieces) == stream.text == tok.decode(ids, skip_special_tokens=True) == text
    assert stream.ids == ids and not stream.stopped


def test_each_character_is_released_as_soon_as_its_last_byte_arrives(tok):
    ids = tok("a🙂b", add_special_tokens=False)["input_ids"]
    stream = TextStream(tokenizer_decode(tok))
    assert [stream.add(i) for i in ids] == ["a", "", "", "", "🙂", "b"]
    assert stream.finish() == ""


def test_special_tokens_are_skipped(tok):
    ids = tok("hi", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    stream = TextStream.for_tokenizer(tok)
    assert "".join(feed_stream(stream, ids)) == "hi"


def test_an_incomplete_character_at_the_end_is_released_by_finish(tok):
    ids = tok("x🙂", add_special_tokens=False)["input_ids"][:-1]  # the emoji's last byte never comes
    stream = TextStream.for_tokenizer(tok)
    pieces = [stream.add(i) for i in ids]
    assert "".join(pieces) == "x"
    rest = stream.finish()
    assert rest and set(rest) == {REPLACEMENT} and "".join(pieces) + rest == tok.decode(ids)


def test_stop_strings_end_the_text_even_across_tokens_and_are_never_released_in_part():
    stream = TextStream(toy_decode, ["END", "wor"])
    pieces = feed_stream(stream, [ord(c) for c in "hello END world"])
    assert stream.stopped and stream.text == "hello " and "".join(pieces) == "hello "
    assert len(stream.ids) == len("hello EN") + 1  # stopped at the token completing the stop string
    stream = TextStream(toy_decode, ["xyz"])
    assert "".join(feed_stream(stream, [ord(c) for c in "abxyxyz"])) == "abxy" == stream.text
    with pytest.raises(RuntimeError):
        stream.add(ord("a"))


def test_without_a_stop_hit_the_stream_equals_the_final_text():
    stream = TextStream(toy_decode, ["zz", "q"])
    ids = [ord(c) for c in "no stop here"] + [0, ord("!")]
    assert "".join(feed_stream(stream, ids)) == stream.text == "no stop hereé!"
    assert not stream.stopped
    stream = TextStream(toy_decode)
    assert stream.add(ord("a")) == "a" and stream.add(0) == "" and stream.add(ord("b")) == "éb"
