"""Coding math for gradient codes, pure numpy: importable and testable alone."""

from codedgd.services.codes.cyclic import (
    H_KINDS,
    LRU,
    CyclicCode,
    DecodingVector,
    block_condition,
    cyclic_matrix,
    cyclic_support,
    gaussian_h,
    make_h,
    orthonormal_h,
)
from codedgd.services.codes.encoding import chunk_length, encode, join_chunks, split_chunks
from codedgd.services.codes.erasurehead import early_stop_count, erasure_probability, unbiased_scale
from codedgd.services.codes.frc import covered, divisors, frc_groups, frc_matrix, group_of
from codedgd.services.codes.group_mds import GroupMDSCode, GroupSolve
from codedgd.services.codes.polynomial import (
    POINT_LAYOUTS,
    PolynomialCode,
    PolynomialDecode,
    chebyshev_nodes,
    interleave_step,
)

__all__ = [
    "H_KINDS",
    "LRU",
    "POINT_LAYOUTS",
    "CyclicCode",
    "DecodingVector",
    "GroupMDSCode",
    "GroupSolve",
    "PolynomialCode",
    "PolynomialDecode",
    "block_condition",
    "chebyshev_nodes",
    "chunk_length",
    "covered",
    "cyclic_matrix",
    "cyclic_support",
    "divisors",
    "early_stop_count",
    "encode",
    "erasure_probability",
    "frc_groups",
    "frc_matrix",
    "gaussian_h",
    "group_of",
    "interleave_step",
    "join_chunks",
    "make_h",
    "orthonormal_h",
    "split_chunks",
    "unbiased_scale",
]
