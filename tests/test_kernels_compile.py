"""The Triton kernels compile for a real GPU (sm_90, through ptxas) even on a machine without one.

The interpreter tests check the kernels' arithmetic but run them as numpy, so they cannot catch what only the
compiler rejects (types, layouts, dot shapes).  Triton's CUDA backend ships ptxas, so each kernel is compiled
ahead of time here, in a subprocess where TRITON_INTERPRET is unset, for every variant of the constexpr flags.
"""
import os
import subprocess
import sys
import textwrap

import pytest

triton = pytest.importorskip("triton")

SCRIPT = textwrap.dedent(r'''
    import sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from fastdpr.kernels import inbatch_nll_triton as K

    assert not K.INTERPRETED
    POINTERS = {"q_ptr": "*{dt}", "p_ptr": "*{dt}", "dq_ptr": "*{dt}", "dp_ptr": "*{dt}", "target_ptr": "*i32",
                "rowid_ptr": "*i32", "ids_ptr": "*i32", "valid_ptr": "*u8", "lse_ptr": "*fp32", "grad_ptr": "*fp32"}
    SCALARS = {"M": "i32", "N": "i32", "D": "i32", "stride_q": "i32", "stride_p": "i32", "stride_dq": "i32",
               "stride_dp": "i32", "scale": "fp32", "scale_log2e": "fp32"}

    def compile_one(kernel, dtype, precision, has_valid, has_ids, config):
        names = kernel.arg_names
        signature = {}
        for name in names:
            signature[name] = (POINTERS[name].format(dt=dtype) if name in POINTERS
                               else SCALARS.get(name, "constexpr"))
        constants = dict(HAS_VALID=has_valid, HAS_IDS=has_ids, PRECISION=precision, **config.kwargs)
        constexprs = {(names.index(k),): v for k, v in constants.items() if k in names}
        src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": config.num_warps, "num_stages": config.num_stages})
        assert compiled.asm.get("cubin"), "no cubin produced"

    for kind, kernel in (("fwd", K.lse_fwd_kernel), ("dq", K.lse_bwd_dq_kernel), ("dp", K.lse_bwd_dp_kernel)):
        config = K._gpu_configs(kind)[0]
        for dtype, precision, has_valid, has_ids in (("bf16", "tf32", True, True), ("fp32", "ieee", False, False)):
            compile_one(kernel, dtype, precision, has_valid, has_ids, config)
            print("compiled", kind, dtype, has_valid, has_ids, flush=True)
''')


@pytest.mark.slow
def test_kernels_compile_for_sm90():
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("this triton build has no bundled ptxas to compile CUDA kernels with")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert out.stdout.count("compiled") == 6
