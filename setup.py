"""Build script: the package, plus the native extension ``bonkernels._C`` when it can be built.

* The CPU kernels are built whenever torch and a C++ compiler are present.
* The CUDA kernels are added when torch has CUDA and nvcc is found (torch's CUDAExtension), or
  when forced: ``BONKERNELS_FORCE_CUDA=1`` compiles the torch-free ``csrc/cuda/*.cu`` with bare
  nvcc and links them with libcudart (this works even against a CPU-only torch).
* ``BONKERNELS_SKIP_CUDA=1`` builds the CPU kernels only; ``BONKERNELS_SKIP_EXT=1`` builds no
  extension at all (``import bonkernels`` works without it: the torch/triton backends remain).
* ``BONKERNELS_BARE_NVCC=1`` (with FORCE) takes the bare-nvcc route even with a CUDA torch. Both
  routes launch on torch's current stream under a device guard (csrc/bindings.cpp resolves the
  stream through c10's device-generic interface, so no c10 CUDA header is needed);
  ``torch.ops.bonkernels.build_info()`` bit 1 tells the routes apart at run time;
* ``BONKERNELS_CUDA_ARCHS`` (default "80;90") picks the architectures of the bare nvcc build: a
  cubin for each and PTX of the newest (``nvcc_gencode_flags``); the CUDAExtension build follows
  ``TORCH_CUDA_ARCH_LIST`` as usual (add "+PTX" to its last entry for PTX).

setup.py imports torch, so install with ``pip install --no-build-isolation -e .``.
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def env_flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def note(msg):
    print(f"bonkernels setup: {msg}", file=sys.stderr)


def find_cuda_home():
    for cand in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if cand and os.path.exists(os.path.join(cand, "bin", "nvcc")):
            return cand
    nvcc = shutil.which("nvcc")
    if nvcc:  # resolve wrapper scripts such as /usr/local/bin/nvcc -> the toolkit root
        real = os.path.realpath(nvcc)
        home = os.path.dirname(os.path.dirname(real))
        if os.path.exists(os.path.join(home, "include", "cuda_runtime.h")):
            return home
        for cand in sorted(glob.glob("/usr/local/cuda*"), reverse=True):
            if os.path.exists(os.path.join(cand, "bin", "nvcc")):
                return cand
    if os.path.exists("/usr/local/cuda/bin/nvcc"):
        return "/usr/local/cuda"
    return None


def extensions():
    if env_flag("BONKERNELS_SKIP_EXT"):
        note("BONKERNELS_SKIP_EXT set: no native extension")
        return [], {}
    cuda_home = find_cuda_home()
    if cuda_home and not os.environ.get("CUDA_HOME"):
        # torch guesses CUDA_HOME from `which nvcc` at import; a wrapper script such as
        # /usr/local/bin/nvcc would make it /usr/local. Point it at the real toolkit first.
        os.environ["CUDA_HOME"] = cuda_home
    try:
        import torch
        from torch.utils import cpp_extension
    except Exception as exc:  # pragma: no cover - no torch at build time
        note(f"torch not importable ({exc}): no native extension")
        return [], {}
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None and shutil.which("g++") is None:
        note("no C++ compiler found: no native extension")
        return [], {}

    csrc = os.path.join(ROOT, "csrc")
    rel = lambda p: os.path.relpath(p, ROOT)  # noqa: E731
    sources = [rel(os.path.join(csrc, "bindings.cpp")), rel(os.path.join(csrc, "prepared_call.cpp")),
               rel(os.path.join(csrc, "cpu", "advantages_cpu.cpp"))]
    cu_sources = sorted(rel(p) for p in glob.glob(os.path.join(csrc, "cuda", "*.cu")))
    include_dirs = [os.path.join(csrc, "include"), csrc]
    cxx_flags = ["-O3", "-g0"]  # torch picks the C++ standard its headers need
    link_flags = []
    if "OpenMP" in torch.__config__.parallel_info() and sys.platform != "darwin":
        # at::parallel_for is header code: without -fopenmp its `omp parallel` is ignored and the
        # CPU kernel runs on one thread whatever torch.set_num_threads says.
        cxx_flags.append("-fopenmp")
        link_flags.append("-fopenmp")

    torch_cuda = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    if env_flag("BONKERNELS_SKIP_CUDA"):
        mode = "cpu"
    elif env_flag("BONKERNELS_FORCE_CUDA"):
        if cuda_home is None:
            raise RuntimeError("BONKERNELS_FORCE_CUDA=1 but no nvcc found; set CUDA_HOME to the toolkit root")
        mode = "torch-cuda" if (torch_cuda and not env_flag("BONKERNELS_BARE_NVCC")) else "bare-nvcc"
    else:
        mode = "torch-cuda" if (torch_cuda and cuda_home is not None) else "cpu"
    note(f"building the native extension: {mode}")

    if mode == "torch-cuda":
        nvcc_flags = ["-O3", "-std=c++17", "-lineinfo", "--expt-relaxed-constexpr", *NVCC_PARALLEL]
        ext = cpp_extension.CUDAExtension(
            "bonkernels._C", sources + cu_sources, include_dirs=include_dirs,
            define_macros=[("BK_WITH_CUDA", None), ("BK_TORCH_CUDA", None)],
            extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags}, extra_link_args=link_flags)
        return [ext], {"build_ext": cpp_extension.BuildExtension}

    if mode == "bare-nvcc":
        ext = cpp_extension.CppExtension(
            "bonkernels._C", sources, include_dirs=include_dirs + [os.path.join(cuda_home, "include")],
            define_macros=[("BK_WITH_CUDA", None)], extra_compile_args=cxx_flags, extra_link_args=link_flags,
            library_dirs=[os.path.join(cuda_home, "lib64"), os.path.join(cuda_home, "lib")], libraries=["cudart"],
            runtime_library_dirs=[os.path.join(cuda_home, "lib64"), os.path.join(cuda_home, "lib")])
        ext.bk_cu_sources = cu_sources
        ext.bk_cuda_home = cuda_home
        return [ext], {"build_ext": bare_nvcc_build_ext(cpp_extension.BuildExtension)}

    ext = cpp_extension.CppExtension("bonkernels._C", sources, include_dirs=include_dirs,
                                     extra_compile_args=cxx_flags, extra_link_args=link_flags)
    return [ext], {"build_ext": cpp_extension.BuildExtension}


# advantages.cu holds many kernel instantiations: nvcc optimises and assembles them on every core
# (same registers and spills; the machine code differs by under 1 %), which halves its compile time
# on 2 cores.
NVCC_PARALLEL = ["--split-compile=0", "--threads=0"]


def nvcc_gencode_flags(archs):
    """nvcc -gencode flags: a cubin per architecture, plus PTX of the newest one, so a GPU newer than
    the list still finds a kernel image (the driver JIT-compiles the PTX). "80;90" -> sm_80, sm_90
    cubins and compute_90 PTX."""
    archs = sorted({a.strip() for a in archs.replace(",", ";").split(";") if a.strip()}, key=int)
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    if archs:
        flags.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
    return flags


def bare_nvcc_build_ext(base):
    """build_ext that first compiles the torch-free .cu files with nvcc into extra objects."""

    class BuildWithBareNvcc(base):
        def build_extension(self, ext):
            cu = getattr(ext, "bk_cu_sources", [])
            if cu:
                nvcc = os.path.join(ext.bk_cuda_home, "bin", "nvcc")
                gencode = nvcc_gencode_flags(os.environ.get("BONKERNELS_CUDA_ARCHS", "80;90"))
                os.makedirs(self.build_temp, exist_ok=True)
                for src in cu:
                    obj = os.path.join(self.build_temp, os.path.basename(src) + ".o")
                    cmd = [nvcc, "-O3", "-std=c++17", "--expt-relaxed-constexpr", *NVCC_PARALLEL, "-Xcompiler", "-fPIC",
                           "-I", os.path.join(ROOT, "csrc", "include"), "-I", os.path.join(ROOT, "csrc"),
                           *gencode, "-c", os.path.join(ROOT, src), "-o", obj]
                    note(" ".join(cmd))
                    subprocess.check_call(cmd)
                    ext.extra_objects.append(obj)
            super().build_extension(ext)

    return BuildWithBareNvcc


ext_modules, cmdclass = extensions()

setup(
    name="bonkernels",
    version="0.1.0",
    description="Fused batched pass@k / max@k advantage estimators for RL on LLMs",
    packages=find_packages(include=["bonkernels", "bonkernels.*"]),
    python_requires=">=3.10",
    install_requires=["torch>=2.4", "numpy"],
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
