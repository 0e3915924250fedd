"""Classify an exception from model execution: oom, cuda_driver or other.

The class decides what an operator (and the supervisor) does next: an OOM is recoverable in
the same process, a driver error (illegal address, ECC, launch failure) poisons the CUDA
context and only a restart helps. Errors raised in a worker often reach the engine core as a
re-wrapped exception, so the message text is read along with the type, down the cause chain.
"""

from __future__ import annotations

import re

OOM = "oom"
CUDA_DRIVER = "cuda_driver"
OTHER = "other"

_OOM_PATTERN = re.compile(
    r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation",
    re.IGNORECASE,
)
_DRIVER_PATTERN = re.compile(
    r"illegal memory access|illegal instruction|misaligned address|unspecified launch failure"
    r"|launch failure|uncorrectable ECC|ECC error|device-side assert|CUDA error|cudaError"
    r"|NCCL error|Xid|GPU has fallen off the bus|CUDA driver",
    re.IGNORECASE,
)


def classify_exception(exc: BaseException) -> str:
    """Return the error class of ``exc``, looking through ``__cause__``/``__context__``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    found_driver = False
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = f"{type(current).__name__}: {current}"
        if _OOM_PATTERN.search(text):
            return OOM
        if _DRIVER_PATTERN.search(text):
            found_driver = True
        current = current.__cause__ or current.__context__
    return CUDA_DRIVER if found_driver else OTHER
