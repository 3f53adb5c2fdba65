"""An HTTP answer's body, decoded as its ``Content-Encoding`` says, never inflated more than a piece
at a time.

httpx inflates each piece the network hands it whole, before its reader sees a byte: 64 KiB of
gzip can be 64 MiB of zeros, and a server sends gzip whatever ``Accept-Encoding`` asked for. So
``http.request`` and webhook deliveries read the raw body and inflate it here, lazily, at most
``PIECE_BYTES`` at a time: a reader that stops once it has more than its limit has held at most
that much more. ``gzip`` (``x-gzip``) and ``deflate`` (with its zlib header or without, as httpx
reads it) are decoded, in the reverse order of the header; other codings are passed through, as
httpx does.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator

import httpx

PIECE_BYTES = 64 * 1024
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_RAW_DEFLATE = -zlib.MAX_WBITS


class _Inflater:
    """One coding of the body, inflated lazily, ``PIECE_BYTES`` at most at a time."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self.inflater = zlib.decompressobj(_WBITS[coding])
        self.fed = False

    def inflate(self, pieces: Iterable[bytes]) -> Iterator[bytes]:
        """The inflated ``pieces``; raises ``httpx.DecodingError`` for what does not inflate."""
        for piece in pieces:
            data = piece
            while data:
                output = self._step(data)
                data = self.inflater.unconsumed_tail
                yield output
        try:
            yield self.inflater.flush()  # what the last piece left pending: a few bytes, its input all taken
        except zlib.error as exc:
            raise httpx.DecodingError(str(exc)) from None

    def _step(self, data: bytes) -> bytes:
        try:
            return self._decompress(data)
        except zlib.error as exc:
            if self.coding != "deflate" or self.fed:
                raise httpx.DecodingError(str(exc)) from None
        self.inflater = zlib.decompressobj(_RAW_DEFLATE)  # a deflate body without the zlib header
        try:
            return self._decompress(data)
        except zlib.error as exc:
            raise httpx.DecodingError(str(exc)) from None

    def _decompress(self, data: bytes) -> bytes:
        output = self.inflater.decompress(data, PIECE_BYTES)
        self.fed = True
        return output


def iter_decoded(response: httpx.Response) -> Iterator[bytes]:
    """The body of ``response`` (opened with ``stream=True``), decoded, in pieces of at most
    ``PIECE_BYTES`` of what a coding inflated: the memory a reader holds is what it kept, not what
    the body inflates to. Raises ``httpx.DecodingError`` for a body that is not what its
    ``Content-Encoding`` says, and what reading the stream raises."""
    codings = [value.strip().lower() for value in response.headers.get_list("content-encoding", split_commas=True)]
    pieces: Iterable[bytes] = response.iter_raw()
    for coding in reversed(codings):
        if coding in _WBITS:
            pieces = _Inflater(coding).inflate(pieces)
    return (piece for piece in pieces if piece)
