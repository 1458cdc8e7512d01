"""A toy family, whole in this one module: its declaration and its Triton-only driver (tests/test_toy_family.py).

It declares a vLLM flag, ``--toy-block`` (the block its one kernel is compiled for), its exercise entry and its
tasks, nothing else; ``KERNELCACHE_FAMILIES=helpers.toy_family:FAMILY`` (or ``families.register(FAMILY)``) adds it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelcache.plan.family import About, Family, Flag, Task

BLOCK = Flag("--toy-block", ("256", "128", "512"), "vLLM --toy-block (toy): the toy kernel's block.")


@triton.jit
def toy_double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def toy(vocab: int, block: int) -> dict:
    """The exercise: the kernel over one vocab-long row, compiled for ``block``."""
    import torch

    x = torch.zeros(vocab, dtype=torch.float32)
    toy_double_kernel[(triton.cdiv(vocab, block),)](x, x, vocab, BLOCK=block)
    return {"launches": 1, "block": block}


class Toy(Family):
    name = "toy"
    exercise = "helpers.toy_family:toy"
    about = About("a test's toy family: one Triton kernel, its block from a vLLM flag", ("triton", "Triton"),
                  reads=("vocab", BLOCK.name), note="a test's toy")
    flags = (BLOCK,)

    def tasks(self, plan, vocab: int) -> tuple[Task, ...]:
        return (self.task({"vocab": vocab, "block": int(plan.flag(BLOCK.name))}),)

    def default(self, plan) -> bool:
        return False


FAMILY = Toy()
