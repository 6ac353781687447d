"""The compiled core must be present in the test environment: without it, every compiled-vs-fallback comparison
would quietly compare the fallback with itself."""
import numpy as np


def test_compiled_extension_is_built_and_used():
    import fastdpr._C as C
    from fastdpr.index import build_index
    from fastdpr.index._native import native

    assert native() is C
    x = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    index = build_index(x, "flat")
    scores, ids = index.search(x[:3], 1)
    np.testing.assert_array_equal(ids[:, 0], (x[:3] @ x.T).argmax(1))
    np.testing.assert_allclose(scores[:, 0], (x[:3] @ x.T).max(1), rtol=1e-5)


def test_import_is_light():
    import subprocess
    import sys

    code = "import sys, fastdpr, fastdpr.cli; print('torch' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_model_kernels_are_their_own_extension():
    """The model kernels are built as fastdpr.models._kernels_C, reached through models/compiled.py; the index core
    no longer carries them."""
    import fastdpr._C as C
    import fastdpr.models._kernels_C as K
    from fastdpr.models import compiled

    assert compiled.kernels() is K
    for name in ("attention_bf16", "attention_f32", "linear_bf16", "linear_f32", "layer_norm"):
        assert hasattr(K, name) and not hasattr(C, name), name
    assert not hasattr(K, "IVFPQ") and not hasattr(K, "set_cpu_cap")
