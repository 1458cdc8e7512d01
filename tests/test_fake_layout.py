"""The fake target's tensors have eager torch's layouts: shape, strides and storage offset.

Triton specializes on integer arguments (``== 1``, ``% 16``) and pointer alignment, so a stride the
fake gets wrong is a cache key the GPU asks for and the bundle lacks. Each case builds the same
input layout twice -- real CPU tensors (eager ATen, whose layout rules CUDA shares) and fake CUDA
tensors (exercise/fake_device.py) -- applies the same op, and compares every output's layout.
"""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from kernelcache.exercise.fake_device import fake_cuda  # noqa: E402

VOCABS = (1001, 1010, 1012, 1016, 1024)  # odd, 2, 4 and 8 mod 16, and a multiple of 16
PAD = 64


def padded_slice(batch: int, vocab: int, dtype, device: str):
    """LM-head logits: a [batch, padded] tensor sliced to the vocab, as vLLM's logits processor returns."""
    padded = -(-vocab // PAD) * PAD
    return torch.zeros((batch, padded), dtype=dtype, device=device)[:, :vocab]


def layouts(device: str):
    """Inputs whose layouts stress the rules: size-1 dims, padded rows, offsets, transposes, expands."""
    for batch, vocab in itertools.product((1, 2, 3, 16, 37), VOCABS):
        yield f"pad{batch}x{vocab}", padded_slice(batch, vocab, torch.bfloat16, device)
    for batch in (1, 5):
        yield f"contig{batch}", torch.zeros((batch, 1001), device=device)
        yield f"offset{batch}", torch.zeros((batch + 1, 1003), device=device)[1:, 3:]
        yield f"col{batch}", torch.zeros((1001, batch), device=device)[:, :1]
        yield f"t{batch}", torch.zeros((1001, batch), device=device).t()
        yield f"expand{batch}", torch.zeros((1, 1001), device=device).expand(batch, 1001)
        yield f"unsq{batch}", torch.zeros((batch, 1001), device=device).unsqueeze(1)
        yield f"row{batch}", torch.zeros((batch, 1010), device=device)[batch - 1:batch]
    yield "empty", torch.zeros((0, 1001), device=device)
    yield "vec", torch.zeros(1001, device=device)[1:]
    yield "3d", torch.zeros((2, 1, 3, 1010), device=device)[..., :1001]


OPS = {
    "empty_like": lambda x: torch.empty_like(x),
    "empty_like_fp32": lambda x: torch.empty_like(x, dtype=torch.float32),
    "empty_like_contig": lambda x: torch.empty_like(x, memory_format=torch.contiguous_format),
    "zeros_like": lambda x: torch.zeros_like(x, dtype=torch.float32),
    "ones_like": lambda x: torch.ones_like(x),
    "full_like": lambda x: torch.full_like(x, -1.0),
    "rand_like": lambda x: torch.rand_like(x, dtype=torch.float32),
    "randn_like": lambda x: torch.randn_like(x, dtype=torch.float32),
    "randint_like": lambda x: torch.randint_like(x, 10, dtype=torch.int64),
    "clone": lambda x: x.clone(),
    "clone_contig": lambda x: x.clone(memory_format=torch.contiguous_format),
    "to_fp32": lambda x: x.to(torch.float32),
    "to_fp16": lambda x: x.to(torch.float16),
    "float": lambda x: x.float(),
    "contiguous": lambda x: x.contiguous(),
    "new_empty": lambda x: x.new_empty(x.shape),
    "new_zeros": lambda x: x.new_zeros((x.shape[0], 7)),
    "add": lambda x: x + 1,
    "mul_fp32": lambda x: x * torch.ones((), dtype=torch.float32, device=x.device),
    "div_": lambda x: x.float().clone().div_(2.0),
    "neg": lambda x: -x,
    "exp": lambda x: torch.exp(x.float()),
    "where": lambda x: torch.where(x > 0, x, torch.zeros_like(x)),
    "masked_fill": lambda x: x.masked_fill(x > 0, float("-inf")),
    "softmax": lambda x: torch.softmax(x.float(), dim=-1),
    "log_softmax": lambda x: torch.log_softmax(x, dim=-1, dtype=torch.float32),
    "cumsum": lambda x: torch.cumsum(x.float(), dim=-1),
    "sort": lambda x: torch.sort(x, dim=-1, descending=True),
    "topk": lambda x: torch.topk(x, 1, dim=-1),
    "argmax": lambda x: x.argmax(dim=-1),
    "amax_keepdim": lambda x: x.amax(dim=-1, keepdim=True),
    "sum": lambda x: x.float().sum(dim=-1),
    "gather": lambda x: x.gather(-1, torch.zeros(x.shape[:-1] + (2,), dtype=torch.int64, device=x.device)),
    "scatter": lambda x: x.scatter(-1, torch.zeros(x.shape[:-1] + (1,), dtype=torch.int64, device=x.device), 0.0),
    "index_select": lambda x: x.index_select(-1, torch.zeros(4, dtype=torch.int64, device=x.device)),
    "unsqueeze": lambda x: x.unsqueeze(-1),
    "select0": lambda x: x[0] if x.shape[0] else x,
    "narrow": lambda x: x.narrow(-1, 0, 1),
    "reshape": lambda x: x.reshape(-1),
    "flatten_view": lambda x: x.view(-1) if x.is_contiguous() else x,
    "expand_as": lambda x: x[..., :1].expand_as(x),
    "transpose": lambda x: x.transpose(0, -1),
    "cat": lambda x: torch.cat([x, x], dim=0),
    "stack": lambda x: torch.stack([x, x], dim=1),
    "exponential_": lambda x: torch.empty_like(x, dtype=torch.float32).exponential_(),
    "div_exp": lambda x: x.float().div(torch.empty_like(x, dtype=torch.float32).exponential_()),
}


def layout_of(result) -> list:
    tensors = result if isinstance(result, (tuple, list)) else (result,)
    return [(tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype) for t in tensors]


def eager_and_fake(name: str, op) -> list[tuple]:
    eager = {key: layout_of(op(x)) for key, x in layouts("cpu")}
    with fake_cuda():
        fake = {key: layout_of(op(x)) for key, x in layouts("cuda")}
    return [(name, key, eager[key], fake[key]) for key in eager if eager[key] != fake[key]]


@pytest.mark.parametrize("name", sorted(OPS))
def test_fake_layout_equals_eager(name):
    assert eager_and_fake(name, OPS[name]) == []


def test_the_padded_single_row_keeps_its_stride():
    """The miss the H200 found: MRV2's fp32 copy of one padded row keeps stride (padded, 1)."""
    with fake_cuda():
        logits = padded_slice(1, 1001, torch.bfloat16, "cuda")
        copy = torch.empty_like(logits, dtype=torch.float32)
    assert copy.stride() == (1024, 1)


def test_small_index_tensors_from_python_data_read_back_as_on_the_gpu():
    """FLA's ``prepare_chunk_indices`` reads ``cu_seqlens`` back (``.tolist()``) after slicing and ``cdiv``; a fake
    made from Python data keeps its values through such arithmetic, and loses them when written in place."""
    with fake_cuda():
        cu_seqlens = torch.tensor([0, 64, 100], device="cuda", dtype=torch.int32)
        lens = cu_seqlens[1:] - cu_seqlens[:-1]
        assert lens.device.type == "cuda"
        assert lens.tolist() == [64, 36] and ((lens + 63) // 64).tolist() == [1, 1]
        assert int(cu_seqlens[-1]) == 100 and [int(x) for x in cu_seqlens] == [0, 64, 100]
        cu_seqlens.add_(1)  # the GPU's values changed; the fake's are not known any more
        with pytest.raises(Exception, match="local_scalar_dense"):
            cu_seqlens.tolist()
        with pytest.raises(Exception, match="local_scalar_dense"):
            torch.empty(3, device="cuda").tolist()  # a fake that never had values
