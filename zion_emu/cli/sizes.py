"""Message sizes and element types as nccl-tests spells them."""

from __future__ import annotations

import re

from zion_emu.cli import CliError

# nccl-tests' parsesize: K, M, G are powers of two (1K = 1024).
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^(\d+)([KMGT]?)$", re.IGNORECASE)

# nccl-tests' -d names and their element sizes in bytes.
ELEMENT_BYTES = {
    "int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
    "half": 2, "float": 4, "double": 8, "bfloat16": 2,
}


def parse_size(text: str) -> int:
    """``"8"`` -> 8, ``"1K"`` -> 1024, ``"8G"`` -> 8 * 2**30."""
    m = _SIZE.match(text.strip())
    if not m:
        raise CliError(f"bad size {text!r}: expected a whole number of bytes with an optional "
                       "K, M, G or T suffix (powers of two, 1K = 1024)")
    return int(m.group(1)) * _SUFFIX[m.group(2).upper()]


def size_sweep(min_bytes: int, max_bytes: int, step_factor: int) -> list[int]:
    """min, min·f, min·f², ... up to max, as nccl-tests' -b/-e/-f."""
    if min_bytes < 1:
        raise CliError(f"--min-bytes must be at least 1, got {min_bytes}")
    if min_bytes > max_bytes:
        raise CliError(f"--min-bytes {min_bytes} is larger than --max-bytes {max_bytes}")
    if step_factor < 2:
        raise CliError(f"--step-factor must be at least 2, got {step_factor}")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= step_factor
    return sizes



# Ops whose size is split over the ranks (each rank's piece is size / ranks).
SPLIT_OPS = frozenset({"all_gather", "reduce_scatter", "all_to_all"})


def element_unit(op: str, nranks: int, dtype: str) -> int:
    """Bytes a size must be a multiple of: one element, per rank for the split ops."""
    return ELEMENT_BYTES[dtype] * (nranks if op in SPLIT_OPS else 1)


def whole_element_sizes(op: str, nranks: int, sizes: list[int], dtype: str) -> list[int]:
    """``sizes`` rounded down to whole elements (per rank for the split ops), as
    nccl-tests rounds its counts; empty ones dropped, repeats once."""
    unit = element_unit(op, nranks, dtype)
    out: list[int] = []
    for size in sizes:
        rounded = size // unit * unit
        if rounded > 0 and rounded not in out:
            out.append(rounded)
    return out
