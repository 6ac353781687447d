"""The Triton kernels compile for a real GPU (sm_90, through ptxas) even on a machine without one.

The interpreter tests check the kernels' arithmetic but run them as numpy, so they cannot catch what only the
compiler rejects (types, layouts, dot shapes).  Triton's CUDA backend ships ptxas, so each kernel is compiled
ahead of time here, in a subprocess where TRITON_INTERPRET is unset: every autotune candidate at D = 768 with bf16
inputs, both masks and the positive's gradient, and the first candidate with fp32 inputs and none of them.  The
integer arguments carry the 16-divisibility the launcher specialises for aligned tensors, as at run time.  ptxas's register report is read
back too: each backward kernel must have at least one candidate that spills nothing, or the autotuner would only
have spilling tilings to choose from.
"""
import os
import subprocess
import sys
import textwrap

import pytest

triton = pytest.importorskip("triton")

SCRIPT = textwrap.dedent(r'''
    import os
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from fastdpr.kernels import inbatch_nll_triton as K

    assert not K.INTERPRETED
    PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    POINTERS = {"q_ptr": "*{dt}", "p_ptr": "*{dt}", "dq_ptr": "*{dt}", "dp_ptr": "*{dt}", "target_ptr": "*i32",
                "rowid_ptr": "*i32", "ids_ptr": "*i32", "valid_ptr": "*u8", "lse_ptr": "*fp32", "grad_ptr": "*fp32",
                "part_ptr": "*fp32", "pos_ptr": "*fp32", "gpos_ptr": "*fp32"}
    SCALARS = {"M": "i32", "N": "i32", "D": "i32", "stride_q": "i32", "stride_p": "i32", "stride_dq": "i32",
               "stride_dp": "i32", "stride_split": "i32", "scale": "fp32", "scale_log2e": "fp32"}
    ALIGNED = {"D", "stride_q", "stride_p", "stride_dq", "stride_dp", "stride_split"}
    DIM = 768

    def compile_one(kernel, dtype, precision, has_valid, has_ids, config):
        names = kernel.arg_names
        signature = {}
        for name in names:
            signature[name] = (POINTERS[name].format(dt=dtype) if name in POINTERS
                               else SCALARS.get(name, "constexpr"))
        constants = dict(HAS_VALID=has_valid, HAS_IDS=has_ids, HAS_POS=has_valid, PRECISION=precision,
                         **config.kwargs)
        constexprs = {(names.index(k),): v for k, v in constants.items() if k in names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in POINTERS or n in ALIGNED}
        src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": config.num_warps, "num_stages": config.num_stages})
        assert compiled.asm.get("cubin"), "no cubin produced"
        with tempfile.TemporaryDirectory() as tmp:
            ptx = os.path.join(tmp, "k.ptx")
            with open(ptx, "w") as fh:
                fh.write(compiled.asm["ptx"])
            report = subprocess.run([PTXAS, "-arch=sm_90a", "-v", ptx, "-o", os.path.join(tmp, "k.cubin")],
                                    capture_output=True, text=True, check=True).stderr
        return int(re.search(r"(\d+) bytes spill stores", report).group(1))

    for kind, kernel in K._KERNELS.items():
        configs = K._gpu_configs(kind, DIM)
        for config in configs:  # the autotuner passes these by name: a misspelt one would be a launch error
            assert set(config.kwargs) <= set(kernel.arg_names), (kind, config.kwargs)
        spills = [compile_one(kernel, "bf16", "tf32", True, True, c) for c in configs]
        compile_one(kernel, "fp32", "ieee", False, False, configs[0])
        print("compiled", kind, "spill bytes per candidate", spills, flush=True)
        assert min(spills) == 0, f"{kind}: every candidate spills registers: {spills}"
''')


@pytest.mark.slow
def test_kernels_compile_for_sm90():
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("this triton build has no bundled ptxas to compile CUDA kernels with")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert out.stdout.count("compiled") == 3, out.stdout
