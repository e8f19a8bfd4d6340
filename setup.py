"""Build avo_ops: regenerate the sources from specs/, then compile one extension,
`avo_ops._C`, with ninja.

CUDA kernels are built when torch has CUDA and nvcc is found (CUDA_HOME); otherwise
the build is CPU-only and says so. The C++ files are compiled with OpenMP where torch
uses it (openmp_flags). Environment:
    AVO_BUILD_CUDA=0          force a CPU-only build
    TORCH_CUDA_ARCH_LIST      GPU architectures (default "8.0;9.0")
    MAX_JOBS                  parallel compile jobs (ninja)
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import time

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CUDA_ARCHS = "8.0;9.0"


def regenerate_sources() -> None:
    sys.path.insert(0, ROOT)
    try:
        from generator.build import generate
        from generator.errors import SpecError
    finally:
        sys.path.pop(0)
    try:
        outcome = generate(ROOT, os.path.join(ROOT, "specs"), check=False)
    except SpecError as error:
        sys.exit(f"error: {error}")
    for path in outcome.written:
        print(f"avo_ops: regenerated {path}")


def locate_cuda_home() -> None:
    """torch takes CUDA_HOME from the nvcc on PATH; when that nvcc is a link or a
    wrapper outside the toolkit (say /usr/local/bin/nvcc), find the toolkit itself
    so that the CUDA headers are found."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return
    for toolkit in (os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "/usr/local/cuda"):
        if os.path.exists(os.path.join(toolkit, "include", "cuda_runtime_api.h")):
            os.environ["CUDA_HOME"] = toolkit
            return


def want_cuda() -> bool:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME

    if os.environ.get("AVO_BUILD_CUDA", "1") == "0":
        print("avo_ops: AVO_BUILD_CUDA=0, building the CPU kernels only")
        return False
    if torch.version.cuda is None or CUDA_HOME is None:
        reason = "torch has no CUDA" if torch.version.cuda is None else "nvcc was not found (set CUDA_HOME)"
        print(f"avo_ops: {reason}; building the CPU kernels only")
        return False
    return True


def openmp_flags() -> list[str]:
    """The CPU kernels split their rows and elements with at::parallel_for. Where ATen's
    parallel backend is OpenMP (torch's Linux builds; ATen/Config.h: AT_PARALLEL_OPENMP,
    which CMakeLists.txt reads), that function is a header template whose parallel
    region compiles only under -fopenmp: without the flag every CPU call ran on the
    calling thread. Compiled and linked with it, the extension shares torch's OpenMP
    runtime (libgomp, already loaded by torch), so torch.set_num_threads applies."""
    import torch

    openmp_backend = "ATen parallel backend: OpenMP" in torch.__config__.parallel_info()
    return ["-fopenmp"] if sys.platform.startswith("linux") and openmp_backend else []


def gcc_vectorizer_flags() -> list[str]:
    """GCC vectorizes a loop whose pointers might overlap by testing at run time that they
    do not, up to 10 pairs of them by default. A backward pass with per-column sums
    (layernorm's: dy, x, weight, dx and two rows of partial sums) has more, and its loop
    ran one element at a time: with up to 32, layernorm's fp32 backward on the CPU ran
    1.96x faster, swish_layernorm's 1.73x (benchmarks/results/2026-12-05-cpu-copies/).
    Other compilers take no such parameter."""
    compiler = os.environ.get("CXX", "c++")
    try:
        macros = subprocess.run([compiler, "-dM", "-E", "-x", "c++", os.devnull], capture_output=True, text=True,
                                check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    is_gcc = "#define __GNUC__" in macros and "__clang__" not in macros
    return ["--param=vect-max-version-for-alias-checks=32"] if is_gcc else []


def extension():
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    cuda = want_cuda()
    sources = ["csrc/python_module.cpp", *sorted(glob.glob("csrc/generated/*.cpp"))]
    include_dirs = [os.path.join(ROOT, d) for d in ("csrc/include", "csrc", "csrc/generated")]
    # -ffp-contract=off: no fused multiply-add but the ones the generated math writes
    # (F::fma). The CPU kernels are compiled for several instruction sets
    # (avo/cpu_copies.h) that must give the same bits, and one expression evaluated in several
    # passes over a row must agree (as -fmad=false below, for the CUDA kernels).
    # -fno-trapping-math: the kernels never read the floating-point exception flags, and
    # without it GCC may not turn the math's selects (erf's two formulas, exp's range
    # limits) into vector blends where the instruction set has no masked arithmetic: the
    # AVX2 and baseline copies then ran one element at a time, 4-8x slower than the
    # AVX-512 one (benchmarks/results/2026-12-05-cpu-avx2-loops/). Same bits either way.
    openmp = openmp_flags()
    cxx_flags = ["-O3", "-ffp-contract=off", "-fno-trapping-math", *gcc_vectorizer_flags(), *openmp]
    # Some toolchains link libstdc++ statically. Its symbols must then stay private to the
    # extension: exported, the process's own libstdc++ (torch's) would take over some of
    # them (its locale tables, say) and formatting a number in an error message crashes.
    link_flags = ["-Wl,--exclude-libs,ALL"] if sys.platform.startswith("linux") else []
    link_flags += openmp
    if not cuda:
        return CppExtension("avo_ops._C", sources, include_dirs=include_dirs, extra_compile_args={"cxx": cxx_flags},
                            extra_link_args=link_flags)
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_CUDA_ARCHS)
    print(f"avo_ops: building CUDA kernels for {os.environ['TORCH_CUDA_ARCH_LIST']}")
    sources += sorted(glob.glob("csrc/generated/*.cu"))
    return CUDAExtension(
        "avo_ops._C",
        sources,
        include_dirs=include_dirs,
        define_macros=[("AVO_WITH_CUDA", None)],
        # -fmad=false: the generated math evaluates the same expression in several passes
        # over a row (x * sigmoid(x) in the mean, then again in x - mean); fused
        # multiply-adds chosen differently in each would make them disagree. The generator
        # writes the ones that are safe itself (F::fma, generator/emit_c.py).
        extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3", "-lineinfo", "-fmad=false"]},
        extra_link_args=link_flags,
    )


regenerate_sources()
locate_cuda_home()

from torch.utils.cpp_extension import BuildExtension  # noqa: E402  (needs torch, after the generator)


class BuildAvoExtension(BuildExtension):
    """Compiles into a fixed ./build/temp folder, so that ninja reuses the objects of
    the last build (pip would otherwise compile everything in a fresh temp folder)
    and prints how long the build took."""

    def finalize_options(self):
        super().finalize_options()
        self.build_temp = os.path.join(ROOT, "build", "temp")

    def run(self):
        start = time.monotonic()
        super().run()
        print(f"avo_ops: extension built in {time.monotonic() - start:.0f} s")

setup(
    name="avo_ops",
    version="0.1.0",
    description="Fused, differentiable PyTorch operators generated from YAML specs",
    packages=find_packages(include=["avo_ops", "avo_ops.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildAvoExtension},
    python_requires=">=3.10",
    install_requires=["torch>=2.4"],
)
