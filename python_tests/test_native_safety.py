"""Safety of the native (C++/CUDA) path with checks off, provable without a GPU.

* The CUDA kernels' group flow and sort networks, emulated on the host on NaN/inf inputs
  and malformed offsets (csrc/tests/test_cuda_guards.cpp, also run by ctest in scripts/ci_native.sh).
* Strided offsets/values/deltas reach the native op with correct results.
* The bare-nvcc build embeds compute_90 PTX next to its cubins.
* Both CUDA build routes take torch's current stream and a device guard (a static check of the
  binding: the GPU check exercises it on hardware).
"""

import ast
import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from bonkernels import _native, estimators, reference

ROOT = Path(__file__).resolve().parents[1]
needs_ext = pytest.mark.skipif(not _native.available(), reason="native extension not built")


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler")
def test_cuda_guards_emulated_on_the_host(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    exe = tmp_path / "test_cuda_guards"
    subprocess.run([cxx, "-std=c++17", "-O1", "-I", str(ROOT / "csrc" / "include"), "-I", str(ROOT / "csrc"),
                    str(ROOT / "csrc" / "tests" / "test_cuda_guards.cpp"), "-o", str(exe)], check=True, timeout=300)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert " 0 failures" in proc.stdout
    assert "caught writing outside" in proc.stdout  # the pre-fix flows were run and caught


def _args(values, offsets, deltas, est, k=2):
    return (values, offsets, deltas, k, est.code, 0.3 if est.needs_deltas else None, -math.inf, math.inf, True, 2,
            1e-6)


@needs_ext
@pytest.mark.parametrize("name", ["maxk", "maxk_offpolicy", "grpo"])
def test_strided_index_and_value_tensors(name):
    est = estimators.get(name)
    gen = torch.Generator().manual_seed(14)
    sizes = [3, 1, 7, 4, 9]
    offsets = torch.tensor([0] + sizes).cumsum(0)
    N = int(offsets[-1])
    values = torch.randn(N, generator=gen, dtype=torch.float64)
    deltas = (torch.rand(N, generator=gen, dtype=torch.float64) - 0.5) if est.needs_deltas else None
    want = reference.advantages_packed(*_args(values, offsets, deltas, est))
    # every other entry of a longer tensor: offsets=t[::2] as in the issue, values/deltas likewise
    strided_off = torch.stack([offsets, torch.full_like(offsets, -7)], 1).reshape(-1)[::2]
    strided_val = torch.stack([values, torch.full_like(values, math.nan)], 1).reshape(-1)[::2]
    strided_del = None
    if deltas is not None:
        strided_del = torch.stack([deltas, torch.full_like(deltas, math.nan)], 1).reshape(-1)[::2]
    assert not strided_off.is_contiguous() and not strided_val.is_contiguous()
    got = _native.advantages_packed(*_args(strided_val, strided_off, strided_del, est))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def _setup_function(name):
    tree = ast.parse((ROOT / "setup.py").read_text())
    fn = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name)
    namespace = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "setup.py", "exec"), namespace)
    return namespace[name]


def test_bare_nvcc_build_embeds_ptx_of_the_newest_arch():
    flags = _setup_function("nvcc_gencode_flags")("90;80")
    assert "-gencode=arch=compute_80,code=sm_80" in flags
    assert "-gencode=arch=compute_90,code=sm_90" in flags
    assert "-gencode=arch=compute_90,code=compute_90" in flags  # PTX: newer GPUs JIT it
    assert _setup_function("nvcc_gencode_flags")("") == []


def test_both_cuda_routes_use_the_current_stream_and_a_device_guard():
    src = (ROOT / "csrc" / "bindings.cpp").read_text()
    body = src[src.index("void out_cuda("):]
    body = body[:body.index("\n}\n")]
    assert "c10::DeviceGuard guard(values.device())" in body
    assert "current_cuda_stream(values.device())" in body
    assert "#if" not in body  # no route-dependent stream: the bare-nvcc build takes the same path
    assert "c10/cuda/" not in src  # the bare route compiles without torch's CUDA headers


@needs_ext
def test_build_route_is_reported():
    route = _native.build_route()
    assert route in ("cpu", "bare-nvcc", "torch-cuda")
    assert (route != "cpu") == bool(torch.ops.bonkernels.build_info() & 1)


@needs_ext
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_non_finite_delta_poisons_its_group_even_when_clamped(bad):
    # The clamp would turn an infinite delta into the bound: the contract is checked on the raw delta.
    est = estimators.get("maxk_offpolicy")
    values = torch.rand(12, dtype=torch.float64)
    deltas = (torch.rand(12, dtype=torch.float64) - 0.5) * 0.2
    deltas[6] = bad
    offsets = torch.tensor([0, 5, 12])
    got = _native.advantages_packed(values, offsets, deltas, 2, est.code, 0.3, -math.inf, math.inf, False, 2, 1e-6)
    assert torch.isnan(got[5:]).all()
    want = reference.advantages_packed(values[:5], offsets[:2], deltas[:5], 2, est.code, 0.3, -math.inf, math.inf,
                                       False, 2, 1e-6)
    torch.testing.assert_close(got[:5], want)
