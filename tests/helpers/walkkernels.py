"""Small real ``@triton.jit`` functions whose dependency walks depend on the order they are first walked in: a
kernel calls ``twice``, which calls ``mix``, which reads two ``constexpr`` globals (tests/test_walk_replay.py)."""

import triton
import triton.language as tl

SCALE = tl.constexpr(3)
SALT = tl.constexpr(17)
OFFSET = tl.constexpr(5)


@triton.jit
def mix(x):
    return x * SCALE + SALT


@triton.jit
def twice(x):
    return mix(mix(x))


@triton.jit
def other_mix(x):
    return x * 2


@triton.jit
def scale_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, twice(tl.load(x_ptr + offs, mask=mask)) + OFFSET, mask=mask)


@triton.jit
def plain_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)
