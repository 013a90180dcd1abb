"""SGLang's server for this CPU test machine: `python sglang_cli.py --model-path M ...`.

The same as `python -m sglang.launch_server ...`, with one knob for the test fixtures.

SGLANG_CLI_FORCE_AMX=1 answers SGLang's AMX check (torch.cpu._is_amx_tile_supported, read by
sglang/srt/utils/common.py cpu_has_amx_support) with yes. SGLang serves speculative decoding on
a CPU only through its `intel_amx` attention backend; on a CPU without AMX tiles it swaps that
backend for `torch_native`, which EAGLE, EAGLE3 and STANDALONE refuse ("EAGLE is not supported
in decode attention backend torch_native", srt/speculative/draft_utils.py). The CPU kernels
(sgl_kernel's brgemm) also run on AVX-512 without AMX, only slower, so saying yes lets the
rehearsal and the tests run SGLang's real speculative path on this machine. It is a fixture:
never set it on a host that serves for real, and never in orch or in a plan for a GPU host.

The patch sits at module level on purpose: SGLang starts its scheduler and detokenizer with
multiprocessing's spawn, which runs this file again (as __mp_main__) in each child.
"""

import os
import sys

import torch

if os.environ.get("SGLANG_CLI_FORCE_AMX") == "1":
    torch.cpu._is_amx_tile_supported = lambda: True

if __name__ == "__main__":
    # What `python -m sglang.launch_server` does, called from here rather than through runpy:
    # the spawned children must find this file as their __main__ (runpy would put SGLang's
    # module there, and the patches above would not run in them).
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    try:
        run_server(prepare_server_args(sys.argv[1:]))
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
