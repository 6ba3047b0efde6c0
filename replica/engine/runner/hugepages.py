"""Tensors backed by transparent huge pages (2 MiB) where the kernel allows them.

The KV pool and the weights are read once per step in full; in 4 KiB pages, a full batch's
KV (tens of MB, in blocks scattered over the pool) exceeds the TLB's reach and every few KB
cost a page walk. `huge_zeros` allocates with `madvise(MADV_HUGEPAGE)` on the range before the
first write, so the kernel backs it with huge pages where `transparent_hugepage` is `madvise`
or `always`. Anywhere that does not work (not Linux, no libc, THP `never`), the tensor is an
ordinary one: the advice changes speed, never contents.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

import torch

log = logging.getLogger(__name__)

MADV_HUGEPAGE = 14
HUGE_PAGE = 2 << 20
_PAGE = 4096
_libc = None


def _madvise():
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _libc.madvise.restype = ctypes.c_int
        except OSError:
            _libc = False
    return _libc.madvise if _libc else None


def advise_huge(t: torch.Tensor) -> bool:
    """Ask for huge pages under the whole 4 KiB pages of `t`'s storage (call before the first
    write: pages already touched stay small until khugepaged merges them). True if advised."""
    madvise = _madvise()
    if madvise is None or not sys.platform.startswith("linux") or t.device.type != "cpu":
        return False
    start = t.untyped_storage().data_ptr()
    end = start + t.untyped_storage().nbytes()
    first, last = (start + _PAGE - 1) // _PAGE * _PAGE, end // _PAGE * _PAGE
    if last - first < HUGE_PAGE:
        return False
    return madvise(first, last - first, MADV_HUGEPAGE) == 0


def huge_zeros(shape, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """torch.zeros, in huge pages where possible (CPU only; other devices: plain zeros)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    # room for a 2 MiB-aligned start, so the first and last huge page are whole
    numel = 1
    for s in shape:
        numel *= s
    element = torch.empty((), dtype=dtype).element_size()
    raw = torch.empty(numel * element + HUGE_PAGE, dtype=torch.uint8)
    advise_huge(raw)
    offset = (-raw.data_ptr()) % HUGE_PAGE
    t = raw[offset : offset + numel * element].view(dtype).view(shape)
    t.zero_()
    return t
