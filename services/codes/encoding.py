"""Worker-side linear encoding of per-partition gradients (pure numpy).

A worker holding partitions j_1..j_p with gradient sums g_j ∈ R^ℓ sends

    f = Σ_j Σ_u C[j, u] · chunk_u(g_j),     chunk_u(v) = pad(v)[u·L:(u+1)·L],

where L = ceil(ℓ / m) and m is the number of chunks. With m = 1 this is the
gradient-coding message Σ_j B_ij g_j of Tandon et al.; with m > 1 the message
is m times shorter (communication-efficient codes).
"""

from __future__ import annotations

import numpy as np


def chunk_length(dim: int, chunks: int) -> int:
    return -(-dim // chunks)


def split_chunks(vector: np.ndarray, chunks: int) -> np.ndarray:
    """The (chunks, L) matrix of the zero-padded vector's equal pieces."""
    length = chunk_length(vector.shape[0], chunks)
    padded = np.zeros(length * chunks, dtype=np.float64)
    padded[: vector.shape[0]] = vector
    return padded.reshape(chunks, length)


def join_chunks(pieces: np.ndarray, dim: int) -> np.ndarray:
    """Inverse of :func:`split_chunks`: concatenate and drop the padding."""
    return np.ascontiguousarray(pieces.reshape(-1)[:dim])


def encode(gradients: np.ndarray, coefficients: np.ndarray) -> np.ndarray:
    """Encode per-partition gradients (p, ℓ) with coefficients (p, m) into length ceil(ℓ/m)."""
    p, dim = gradients.shape
    if coefficients.shape[0] != p:
        raise ValueError(f"{p} partition gradients but {coefficients.shape[0]} coefficient rows")
    chunks = coefficients.shape[1]
    if chunks == 1:
        return np.asarray(coefficients[:, 0] @ gradients, dtype=np.float64)
    length = chunk_length(dim, chunks)
    padded = np.zeros((p, length * chunks), dtype=np.float64)
    padded[:, :dim] = gradients
    blocks = padded.reshape(p, chunks, length)
    out: np.ndarray = np.einsum("pu,pul->l", coefficients, blocks)
    return out
