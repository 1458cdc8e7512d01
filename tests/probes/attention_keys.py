"""Independent probe: the Triton keys vLLM 0.33's TRITON_ATTN backend asks for, under the fake target.

Written without kernelcache's attention exercise (only its fake driver, fake CUDA tensors and import shims:
"the same fake target"): its own CUDA platform (the probes' minimal one plus the capability), its own
``torch.cuda.get_device_capability`` answer, and vLLM's backend objects built directly -- no ``Attention``
layer, no ``VllmConfig``: ``TritonAttentionImpl`` from the backend class, ``TritonAttentionMetadataBuilder``
on a plain namespace config whose CUDA-graph capture sizes follow the documented default list (1, 2, 4,
multiples of 8 below 256, multiples of 16 up to min(2 * max_num_seqs, 512, max_num_batched_tokens), and max_num_seqs), a
contiguous ``[blocks, kv_heads, block_size, 2 * head_size]`` KV cache, contiguous q/k/v, and a block table
``cdiv(max_model_len, block_size)`` wide aligned to 128 tokens. Then ``do_kv_cache_update`` and
``forward`` on a seeded random sweep of batch compositions: decode batches (some padded to a capture size,
some built for capture), short queries, prefills with and without a cached prefix, and mixed batches,
token budget and context lengths drawn at random within the limits.

Prints one JSON line per compile() call: {"name", "key", "hit"}.

    python attention_keys.py CAPABILITY SM_COUNT HEADS KV_HEADS HEAD_SIZE DTYPE BLOCK MAX_NUM_SEQS \
        MAX_MODEL_LEN MAX_NUM_BATCHED_TOKENS ROUNDS [WINDOW]

HEADS / KV_HEADS are per rank. With ROUNDS 0 only the largest batches are run (useful with limits larger
than the build's).
"""

import random
import sys
from types import SimpleNamespace

import probe_target  # this folder: the fake target, a CUDA platform, the compile log

capability, sm_count, heads, kv_heads, head_size = map(int, sys.argv[1:6])
dtype_name = sys.argv[6]
block, seqs, max_len, max_tokens, rounds = map(int, sys.argv[7:12])
window = int(sys.argv[12]) if len(sys.argv) > 12 else 0
events = probe_target.start(capability, sm_count)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import vllm.platforms  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402

from kernelcache.exercise import fake_ops  # noqa: E402
from kernelcache.exercise.fake_device import fake_cuda  # noqa: E402


class AttentionProbeCuda(type(vllm.platforms._current_platform)):
    @classmethod
    def get_device_capability(cls, device_id=0):
        return DeviceCapability(capability // 10, capability % 10)

    @classmethod
    def get_device_name(cls, device_id=0):
        return f"probe sm_{capability}"


vllm.platforms._current_platform = AttentionProbeCuda()
torch.cuda.get_device_capability = lambda device=None: (capability // 10, capability % 10)
fake_ops.install_import_shims()

from vllm.config import CUDAGraphMode  # noqa: E402
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402

rng = random.Random(20261205)
dtype = getattr(torch, dtype_name)
cuda = torch.device("cuda")
WIDTH = -(-max_len // 128) * 128 // block if 128 % block == 0 else -(-max_len // block)
NUM_BLOCKS = 4 * WIDTH + 7


def capture_sizes():
    top = min(2 * seqs, 512, max_tokens)
    return sorted({s for s in [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16), seqs] if s <= top})


def config():
    model = SimpleNamespace(get_num_attention_heads=lambda parallel=None: heads,
                            get_num_kv_heads=lambda parallel=None: kv_heads, get_head_size=lambda: head_size,
                            rswa_window=None)
    compilation = SimpleNamespace(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE,
                                  cudagraph_capture_sizes=capture_sizes(), static_forward_context={})
    return SimpleNamespace(model_config=model, compilation_config=compilation, speculative_config=None,
                           scheduler_config=SimpleNamespace(max_num_seqs=seqs), parallel_config=None)


def real(array):
    with torch.utils._python_dispatch._disable_current_modes():
        return torch.from_numpy(array)


class Probe:
    def __init__(self):
        spec = FullAttentionSpec(block_size=block, num_kv_heads=kv_heads, head_size=head_size, dtype=dtype,
                                 sliding_window=window or None)
        self.builder = TritonAttentionBackend.get_builder_cls()(spec, ["probe.attn"], config(), cuda)
        self.impl = TritonAttentionBackend.get_impl_cls()(heads, head_size, head_size**-0.5, kv_heads, None,
                                                           window or None, "auto")
        scale = torch.ones((), dtype=torch.float32, device=cuda)
        self.layer = SimpleNamespace(_k_scale=scale, _v_scale=scale, _q_scale=scale)
        self.kv_cache = torch.empty((NUM_BLOCKS, kv_heads, block, 2 * head_size), dtype=dtype, device=cuda)
        self.tables = torch.zeros((seqs, WIDTH), dtype=torch.int32, device=cuda)
        self.starts = torch.zeros(seqs + 1, dtype=torch.int32, device=cuda)
        self.lens = torch.zeros(seqs, dtype=torch.int32, device=cuda)
        self.slots = torch.zeros(max_tokens, dtype=torch.int64, device=cuda)

    def run(self, queries, contexts, pad=0, capture=False):
        reqs, tokens = len(queries) + pad, sum(queries)
        q_lens = np.array(queries + [0] * pad, dtype=np.int32)
        starts = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        self.starts[: reqs + 1].copy_(real(starts))
        self.lens[:reqs].copy_(real(np.array(contexts + [0] * pad, dtype=np.int32)))
        common = CommonAttentionMetadata(
            query_start_loc=self.starts[: reqs + 1], query_start_loc_cpu=real(starts), seq_lens=self.lens[:reqs],
            max_seq_len=max_len if capture else max(contexts), num_reqs=reqs, num_actual_tokens=tokens,
            max_query_len=int(q_lens.max()), block_table_tensor=self.tables[:reqs], slot_mapping=self.slots[:tokens],
            causal=True)
        metadata = (self.builder.build_for_cudagraph_capture(common) if capture
                    else self.builder.build(0, common))
        q = torch.empty((tokens, heads, head_size), dtype=dtype, device=cuda)
        k = torch.empty((tokens, kv_heads, head_size), dtype=dtype, device=cuda)
        v = torch.empty((tokens, kv_heads, head_size), dtype=dtype, device=cuda)
        out = torch.empty((tokens, heads, head_size), dtype=dtype, device=cuda)
        self.impl.do_kv_cache_update(self.layer, k, v, self.kv_cache, self.slots[:tokens])
        self.impl.forward(self.layer, q, k, v, self.kv_cache, metadata, out)


def batches():
    """(queries, contexts, pad, capture) tuples: a random sweep, or the largest batches when rounds == 0."""
    if rounds == 0:
        yield [1] * seqs, [max_len] * seqs, 0, False
        yield [min(max_tokens, max_len)], [max_len], 0, False
        return
    sizes = capture_sizes()
    for _ in range(rounds):
        kind = rng.choice(["decode", "padded", "capture", "short", "prefill", "mixed"])
        if kind in ("decode", "padded", "capture"):
            n = rng.randint(1, min(seqs, max_tokens))
            pad = 0
            if kind != "decode":
                top = next((s for s in sizes if s >= n), None)
                if top is None or top > seqs:
                    continue
                pad = top - n
            yield [1] * n, [rng.randint(1, max_len) for _ in range(n)], pad, kind == "capture"
        elif kind == "short":
            n = rng.randint(1, max(1, min(seqs, max_tokens // 8, 24)))
            queries = [rng.randint(1, 8) for _ in range(n)]
            yield queries, [rng.randint(q, max_len) for q in queries], 0, False
        elif kind == "prefill":
            length = rng.randint(9, min(max_tokens, max_len))
            yield [length], [rng.randint(length, max_len)], 0, False
        else:
            n = rng.randint(2, min(seqs, max_tokens - 8))
            chunk = rng.randint(9, min(max_tokens - (n - 1), max_len))
            queries = [chunk] + [1] * (n - 1)
            yield queries, [rng.randint(q, max_len) for q in queries], 0, False


with fake_cuda():
    probe = Probe()
    for queries, contexts, pad, capture in batches():
        probe.run(queries, contexts, pad, capture)
probe_target.report(events)
