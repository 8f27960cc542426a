"""Coding math for gradient codes, pure numpy: importable and testable alone."""

from services.codes.encoding import chunk_length, encode, join_chunks, split_chunks

__all__ = ["chunk_length", "encode", "join_chunks", "split_chunks"]
