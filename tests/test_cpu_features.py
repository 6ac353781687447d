"""The CPU-feature registry (csrc/cpu.h, ``fastdpr.cpu_features``): one answer, whichever module is asked and
whichever kernel runs; the FASTDPR_SIMD cap applies to every kernel; asking needs no torch."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from compiled_extension import kernels_extension

import fastdpr

_C = pytest.importorskip("fastdpr._C")
K = kernels_extension()
pytestmark = pytest.mark.skipif(K is None, reason="compiled model kernels not built")
LEVELS = fastdpr.CPU_LEVELS


def test_every_module_gives_the_same_answer():
    features = fastdpr.cpu_features()
    assert set(features) == set(LEVELS) | {"cap"}
    for module in (_C, K):
        answer = module.cpu_features()
        assert answer.pop("cap_valid") is True
        assert answer == features
    detected = fastdpr.cpu_features(detected=True)
    for module in (_C, K):
        assert {k: v for k, v in module.cpu_features(True).items() if k != "cap_valid"} == detected
    for level in LEVELS:
        assert not features[level] or detected[level], level  # the cap only takes away


def test_python_names_the_levels_as_the_registry_does():
    for module in (_C, K):
        assert tuple(module.cpu_levels()) == LEVELS


def test_each_level_implies_the_ones_before_it():
    for features in (fastdpr.cpu_features(), fastdpr.cpu_features(detected=True)):
        flags = [features[level] for level in LEVELS]
        assert flags == sorted(flags, reverse=True), features


def test_every_kernel_asks_the_registry():
    f = fastdpr.cpu_features()
    widest = [lv for lv in LEVELS if f[lv]][-1]
    assert _C.cpu_level() == K.cpu_level() == widest
    assert _C.simd_level() == ("avx512" if f["avx512"] else "avx2" if f["avx2"] else "scalar")
    assert _C.pq4_kernel() == ("avx512bw" if f["avx512"] else _C.simd_level())
    assert ("avx512" in K.layer_norm_paths()) == f["avx512"]
    assert ("avx512" in K.dropout_paths()) == f["avx512"]
    assert ("avx512" in K.attention_paths("f32")) == f["avx512"]
    assert ("avx512" in K.linear_f32_paths()) == f["avx512"]
    assert ("avx512_bf16" in K.attention_paths("bf16")) == f["avx512_bf16"]
    assert ("avx512_bf16" in K.linear_bf16_paths()) == f["avx512_bf16"]
    assert ("amx" in K.attention_paths("bf16")) == f["amx"]


# every binding that takes a CPU level name, called with one that is no level (each argument otherwise valid,
# so that only the name can be what is refused)
def _level_calls():
    import numpy as np

    a = np.ones(8, np.float32)
    blocks, table = _C.pq4_pack(np.zeros((1, 2), np.uint8)), np.zeros((_C.pq4_padded_m(2), 16), np.uint8)
    lo, step = _C.sq4_train(np.ones((2, 8), np.float32))
    rows = _C.sq4_encode(np.ones((2, 8), np.float32), lo, step)
    qkv, out, groups = np.zeros((2, 96), np.float32), np.zeros((2, 32), np.float32), np.array([[1, 2]])
    bqkv, bout = np.zeros((2, 96), np.uint16), np.zeros((2, 32), np.uint16)
    w = np.zeros((32, 8), np.float32)
    return {
        "simd_dot": lambda lv: _C.simd_dot(a, a, lv),
        "simd_dot_f16": lambda lv: _C.simd_dot_f16(a, np.zeros(8, np.uint16), lv),
        "simd_l2sq": lambda lv: _C.simd_l2sq(a, a, lv),
        "simd_dot4x4": lambda lv: _C.simd_dot4x4(np.ones((4, 8), np.float32), np.ones((4, 8), np.float32), lv),
        "to_half": lambda lv: _C.to_half(a, lv),
        "from_half": lambda lv: _C.from_half(np.zeros(8, np.uint16), lv),
        "set_cpu_cap": lambda lv: _C.set_cpu_cap(_C.set_cpu_cap(lv)),  # the cap put back
        "pq4_kernel": lambda lv: _C.pq4_kernel(lv),
        "pq4_scan": lambda lv: _C.pq4_scan(blocks, 1, 2, table, lv),
        "pq4_topk": lambda lv: _C.pq4_topk(blocks, 1, 2, table, 1, lv),
        "pq4_filter": lambda lv: _C.pq4_filter(np.zeros(4, np.uint16), 1, lv),
        "pq4_quantize_lut": lambda lv: _C.pq4_quantize_lut(np.zeros((2, 16), np.float32), lv),
        "sq4_scores": lambda lv: _C.sq4_scores(np.ones(8, np.float32), rows, lo, step, lv),
        "attention_bf16": lambda lv: K.attention_bf16(bqkv, bout, groups, 1, lv),
        "attention_f32": lambda lv: K.attention_f32(qkv, out, groups, 1, lv),
        "linear_bf16": lambda lv: K.linear_bf16(np.zeros((1, 8), np.uint16), K.linear_bf16_pack(w.astype(np.uint16)),
                                                32, out=np.zeros((1, 32), np.float32), path=lv),
        "linear_f32": lambda lv: K.linear_f32(np.zeros((1, 8), np.float32), K.linear_f32_pack(w), 32,
                                              out=np.zeros((1, 32), np.float32), path=lv),
        "layer_norm": lambda lv: K.layer_norm(np.ones((2, 8), np.float32), np.ones(8, np.float32),
                                              np.zeros(8, np.float32), 1e-5, np.zeros((2, 8), np.float32), lv),
        "dropout_": lambda lv: K.dropout_(np.ones(8, np.float32), 0.5, 1, 2.0, lv),
    }


@pytest.mark.parametrize("fn", sorted(_level_calls()))
def test_every_binding_refuses_an_unknown_level_listing_the_levels(fn):
    call = _level_calls()[fn]
    call("scalar")  # valid otherwise
    with pytest.raises(ValueError, match=f"{fn}: unknown CPU level 'bogus'; the levels are {', '.join(LEVELS)}"):
        call("bogus")


@pytest.mark.parametrize("fn", sorted(_level_calls()))
def test_every_binding_refuses_a_level_this_cpu_cannot_run(fn):
    lacking = [lv for lv in LEVELS if not fastdpr.cpu_features(detected=True)[lv]]
    if not lacking:
        pytest.skip("this CPU runs every level")
    with pytest.raises(ValueError, match=f"{fn}: .*this CPU cannot run the {lacking[0]} level|{fn}: no {lacking[0]}"):
        _level_calls()[fn](lacking[0])


def test_a_level_without_a_kernel_in_the_table_is_named():
    import numpy as np

    with pytest.raises(ValueError, match="layer_norm: no avx2 kernel; it has avx512, scalar"):
        K.layer_norm(np.ones((2, 8), np.float32), np.ones(8, np.float32), np.zeros(8, np.float32), 1e-5,
                     np.zeros((2, 8), np.float32), "avx2")


def test_the_cap_moved_in_process_applies_to_the_index_kernels_and_is_put_back():
    import numpy as np

    before = _C.cpu_level()
    assert _C.set_cpu_cap("scalar") == before
    try:
        assert _C.cpu_level() == _C.simd_level() == _C.pq4_kernel() == "scalar"
        assert _C.cpu_features()["avx2"] is False
        with pytest.raises(ValueError, match="pq4_kernel: the avx2 level is above the cap, scalar"):
            _C.pq4_kernel("avx2")
        a = np.ones(8, np.float32)
        assert _C.simd_dot(a, a) == 8.0
    finally:
        assert _C.set_cpu_cap(before) == "scalar"
    assert _C.cpu_level() == before
    assert K.cpu_level() == before  # the model kernels' module has its own copy of the registry


_PROBE = """
import json, sys
from fastdpr import _C, _cpu
from fastdpr.models import _kernels_C as K
features = _cpu.cpu_features()
assert features.pop("cap_valid") == (features["cap"] != "avx9000")
print(json.dumps({"features": features, "simd": _C.simd_level(), "level": _C.cpu_level(),
                  "layer_norm": K.layer_norm_paths(),
                  "attention_bf16": K.attention_paths("bf16"), "attention_f32": K.attention_paths("f32"),
                  "linear_bf16": K.linear_bf16_paths(), "linear_f32": K.linear_f32_paths()}))
"""


def _probe(cap: str) -> dict:
    env = {**os.environ, "FASTDPR_SIMD": cap}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("cap", ["scalar", "avx2", "avx512", "avx512_bf16"])
def test_the_cap_applies_to_every_kernel(cap):
    detected = fastdpr.cpu_features(detected=True)
    got = _probe(cap)
    allowed = LEVELS[:LEVELS.index(cap) + 1]
    assert got["features"] == {**{lv: detected[lv] and lv in allowed for lv in LEVELS}, "cap": cap}
    f = got["features"]
    assert got["simd"] == ("avx512" if f["avx512"] else "avx2" if f["avx2"] else "scalar")
    assert got["level"] == [lv for lv in LEVELS if f[lv]][-1]
    assert got["layer_norm"] == (["avx512", "scalar"] if f["avx512"] else ["scalar"])
    assert got["attention_f32"] == (["avx512", "scalar"] if f["avx512"] else ["scalar"])
    assert got["linear_f32"] == (["avx512", "scalar"] if f["avx512"] else ["scalar"])
    assert got["linear_bf16"] == (["avx512_bf16", "scalar"] if f["avx512_bf16"] else ["scalar"])
    assert got["attention_bf16"] == [lv for lv in ("amx", "avx512_bf16", "scalar") if f[lv]]
    if cap != "scalar" and not detected[cap]:
        pytest.skip(f"{cap}: this CPU lacks it, so the cap at {cap} was checked only as no cap below it")


def test_an_unknown_cap_is_an_error_that_names_it():
    code = "import fastdpr; fastdpr.cpu_features()"
    env = {**os.environ, "FASTDPR_SIMD": "avx9000"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert "FASTDPR_SIMD='avx9000'" in out.stderr and "InputError" in out.stderr
    # the kernels ignore it: the same levels as without a cap
    probe = _probe("avx9000")
    assert {k: v for k, v in probe["features"].items() if k != "cap"} == \
        {k: v for k, v in fastdpr.cpu_features(detected=True).items() if k != "cap"}


def test_asking_imports_no_torch():
    code = ("import sys, json, fastdpr; f = fastdpr.cpu_features(); "
            "print(json.dumps([sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')), f]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    modules, features = json.loads(out.stdout)
    assert modules == []
    assert features == fastdpr.cpu_features()
