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
