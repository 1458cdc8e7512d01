"""The server's stand-in where the examples are run (tests/test_examples_run.py): what `kernelcache run` execs in
place of `vllm serve`.

It prints one JSON line with the variables the wrapper set that decide where Triton's cache is, then runs vLLM's
sampler paths in this process (vllm_keys.py, beside it: one JSON line per compile() call, {"name", "key", "hit"}).

    python served_sampler.py CAPABILITY SM_COUNT VOCAB MAX_NUM_SEQS PATHS
"""

import json
import os
import runpy
import sys

WHERE = ("TRITON_CACHE_DIR", "TRITON_CACHE_MANAGER", "KERNELCACHE_BASE_DIR", "KERNELCACHE_MISS_LOG")
print(json.dumps({"served": {name: os.environ.get(name) for name in WHERE}}), flush=True)
keys = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_keys.py")
sys.argv = [keys, *sys.argv[1:]]
runpy.run_path(keys, run_name="__main__")
