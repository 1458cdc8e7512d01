"""kernelcache's own small Triton kernels, for self-tests and the pack/install demo.

They are launched through Triton's normal JIT path (``kernel[grid](...)``) with CPU tensors, so
under the fake target they specialize exactly as on a GPU: pointer dtype and alignment, integers
``== 1`` / ``% 16 == 0`` / other, constexprs, ``num_warps``. ``run()`` calls every kernel across
those classes and returns the number of launches.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr, SQUARE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32) * factor
    if SQUARE:
        x = x * x
    tl.store(out_ptr + offs, x.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def row_max_kernel(x_ptr, out_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        vals = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=float("-inf"))
        best = tl.maximum(best, vals.to(tl.float32))
    tl.store(out_ptr + row, tl.max(best, axis=0))


@triton.jit(do_not_specialize=["seed"])
def gumbel_argmax_kernel(logits_ptr, out_ptr, stride, vocab, seed, BLOCK: tl.constexpr):
    """A sampler-like kernel: a vocab loop, counter-based random numbers, an argmax."""
    row = tl.program_id(0)
    best_val = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK], tl.int32)
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < vocab
        logits = tl.load(logits_ptr + row * stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
        u = tl.rand(seed, row * vocab + cols)
        noised = logits - tl.log(-tl.log(u + 1e-10) + 1e-10)
        better = noised > best_val
        best_val = tl.where(better, noised, best_val)
        best_idx = tl.where(better, cols, best_idx)
    winner = tl.argmax(best_val, axis=0)
    idx = tl.sum(tl.where(tl.arange(0, BLOCK) == winner, best_idx, 0), axis=0)
    tl.store(out_ptr + row, idx)


def run(device: str = "cpu") -> int:
    """Launch every kernel across its specialization classes; returns the launch count."""
    import torch

    launches = 0
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for n in (4096, 4097, 1):
            x = torch.zeros(max(n, 16), dtype=dtype, device=device)
            add_kernel[(triton.cdiv(n, 1024),)](x, x, x, n, BLOCK=1024)
            launches += 1
        for square in (False, True):
            x = torch.zeros(4096, dtype=dtype, device=device)
            scale_kernel[(4,)](x, x, 4096, 0.5, BLOCK=1024, SQUARE=square)
            launches += 1
    for vocab, warps in ((32000, 4), (50257, 4), (32000, 8)):
        logits = torch.zeros((2, vocab), dtype=torch.float32, device=device)
        out = torch.zeros(2, dtype=torch.float32, device=device)
        row_max_kernel[(2,)](logits, out, logits.stride(0), vocab, BLOCK=1024, num_warps=warps)
        idx = torch.zeros(2, dtype=torch.int32, device=device)
        gumbel_argmax_kernel[(2,)](logits, idx, logits.stride(0), vocab, 1234, BLOCK=1024, num_warps=warps)
        launches += 2
    return launches


def run_variants(device: str = "cpu") -> int:
    """Specializations ``run()`` never launches (another BLOCK, num_warps=2): misses against its bundle."""
    import torch

    x = torch.ones(4096, dtype=torch.float32, device=device)
    out = torch.empty_like(x)
    add_kernel[(8,)](x, x, out, 4096, BLOCK=512)
    scale_kernel[(4,)](x, out, 4096, 0.5, BLOCK=1024, SQUARE=True, num_warps=2)
    return 2
