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


def test_each_level_implies_the_ones_before_it():
    for features in (fastdpr.cpu_features(), fastdpr.cpu_features(detected=True)):
        flags = [features[level] for level in LEVELS]
        assert flags == sorted(flags, reverse=True), features


def test_every_kernel_asks_the_registry():
    f = fastdpr.cpu_features()
    assert _C.simd_supported("avx2") == f["avx2"]
    assert _C.simd_supported("avx512") == f["avx512"]
    assert _C.simd_detect() == ("avx512" if f["avx512"] else "avx2" if f["avx2"] else "scalar")
    assert _C.pq4_kernel(_C.simd_detect()) == ("avx512bw" if f["avx512"] else _C.simd_detect())
    assert ("avx512" in K.layer_norm_paths()) == f["avx512"]
    assert ("avx512" in K.attention_paths("f32")) == f["avx512"]
    assert ("avx512" in K.linear_f32_paths()) == f["avx512"]
    assert ("avx512bf16" in K.attention_paths("bf16")) == f["avx512_bf16"]
    assert ("avx512bf16" in K.linear_bf16_paths()) == f["avx512_bf16"]
    assert ("amx" in K.attention_paths("bf16")) == f["amx"]


_PROBE = """
import json, sys
from fastdpr import _C, _cpu
from fastdpr.models import _kernels_C as K
features = _cpu.cpu_features()
assert features.pop("cap_valid") == (features["cap"] != "avx9000")
print(json.dumps({"features": features, "simd": _C.simd_level(),
                  "simd_avx512": _C.simd_supported("avx512"), "layer_norm": K.layer_norm_paths(),
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
    allowed = LEVELS[:LEVELS.index(cap) + 1] if cap != "scalar" else ()
    assert got["features"] == {**{lv: detected[lv] and lv in allowed for lv in LEVELS}, "cap": cap}
    f = got["features"]
    assert got["simd"] == ("avx512" if f["avx512"] else "avx2" if f["avx2"] else "scalar")
    assert got["simd_avx512"] == f["avx512"]
    assert got["layer_norm"] == (["avx512", "scalar"] if f["avx512"] else ["scalar"])
    assert got["attention_f32"] == (["avx512", "scalar"] if f["avx512"] else ["scalar"])
    assert got["linear_f32"] == (["avx512", "scalar"] if f["avx512"] else ["scalar"])
    assert got["linear_bf16"] == (["avx512bf16", "scalar"] if f["avx512_bf16"] else ["scalar"])
    assert got["attention_bf16"] == [p for p, lv in (("amx", "amx"), ("avx512bf16", "avx512_bf16"), ("scalar", None))
                                     if lv is None or f[lv]]
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
