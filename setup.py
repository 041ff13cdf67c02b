"""Build qcomm._C: the C++ sources always, the CUDA sources when nvcc and a CUDA torch are present.
With QCOMM_TEST_HOOKS=1 (scripts/setup.sh sets it; a plain `pip install .` does not), also
qcomm._testing, the tests' hooks (csrc/testing/), linked against the _C built here so that both
share one copy of the product's code and state; its own sources only are compiled for it.

QCOMM_CUDA=0 forces a CPU-only build, QCOMM_CUDA=1 requires the CUDA build (and fails without nvcc).
QCOMM_CUDA_ARCHS lists the compute capabilities to compile for (default "80;90").
QCOMM_EXPERIMENTS=1 adds csrc/experiments/ (kernels that lost when timed, kept to be timed again).
QCOMM_BUILD_DIR: where objects and the wheel's staging go. By default build/ for the in-place build
of scripts/setup.sh (ninja rebuilds only what changed), and outside the source tree for anything
else (`pip install .`, `pip wheel .`): a folder of the system's temporary directory named after
the tree, kept, so that a second install rebuilds only what changed.
"""

import glob
import hashlib
import os
import sys
import tempfile

from setuptools import setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _want_cuda() -> bool:
    flag = os.environ.get("QCOMM_CUDA", "").strip()
    have = cpp_extension.CUDA_HOME is not None and _torch_has_cuda()
    have = have and bool(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")))
    if flag == "0":
        return False
    if flag == "1":
        if not have:
            raise SystemExit(
                "QCOMM_CUDA=1 but nvcc, a CUDA build of torch or csrc/cuda/*.cu is missing"
            )
        return True
    return have


def _torch_has_cuda() -> bool:
    import torch

    return torch.version.cuda is not None


# No fast-math and no floating-point contraction anywhere: the CPU loops and the CUDA kernels must
# round identically (DESIGN invariant 3). -fopenmp lets at::parallel_for use torch's own libgomp.
# GCC's default -ftrapping-math stays: -fno-trapping-math (until 2026-11-30) made GCC vectorize the
# codec's AVX-512 encoder half as well (2.9 against 6.0 GB/s, fp32 8-bit asymmetric, one core) and
# its baseline loops no faster (benchmarks/results/02-cpu-codec.md); it changes no result either
# way.
CXX_FLAGS = [
    "-O3",
    "-std=c++17",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-fopenmp",
    "-Wall",
]
# Extra flags for special builds, e.g. the sanitizers (scripts/sanitize.sh).
EXTRA = os.environ.get("QCOMM_EXTRA_CFLAGS", "").split()
CXX_FLAGS += EXTRA
NVCC_FLAGS = ["-O3", "-std=c++17", "-fmad=false", "--prec-div=true", "--prec-sqrt=true"]

EXPERIMENTS = os.environ.get("QCOMM_EXPERIMENTS", "0").strip() == "1"
TEST_HOOKS = os.environ.get("QCOMM_TEST_HOOKS", "0").strip() == "1"
HOOKS_DIR = os.path.join("csrc", "testing")


def _sources(ext: str) -> list:
    """Every layer's sources but the test hooks' (csrc/<layer>/*.ext; CUDA-only C++ is guarded by
    QCOMM_WITH_CUDA), and csrc/experiments/<name>/*.ext with QCOMM_EXPERIMENTS=1."""
    found = glob.glob(os.path.join("csrc", "*", "*." + ext))
    found = [f for f in found if os.path.dirname(f) != HOOKS_DIR]
    if EXPERIMENTS:
        found += glob.glob(os.path.join("csrc", "experiments", "*", "*." + ext))
    return sorted(found)


if EXPERIMENTS:
    CXX_FLAGS.append("-DQCOMM_EXPERIMENTS=1")
    NVCC_FLAGS.append("-DQCOMM_EXPERIMENTS=1")
sources = _sources("cpp")
kwargs = dict(
    name="qcomm._C",
    sources=sources,
    include_dirs=[os.path.join(ROOT, "csrc")],
    extra_link_args=["-fopenmp"] + EXTRA,
)

# the hooks: C++ only (cuda_testing.cpp calls the kernels _C holds), compiled with _C's flags so
# that both see the same types; _C itself is a link input (HooksLinkedToC). Lists of their own:
# torch's Extension() appends its include paths to the list it is given, and _C's compile
# commands (which ninja compares to rebuild) must not change with the hooks.
hooks = dict(
    name="qcomm._testing",
    sources=sorted(glob.glob(os.path.join(HOOKS_DIR, "*.cpp"))),
    include_dirs=list(kwargs["include_dirs"]),
    extra_link_args=list(kwargs["extra_link_args"]),
)

if _want_cuda():
    archs = os.environ.get("QCOMM_CUDA_ARCHS", "80;90").split(";")
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs if a]
    kwargs["sources"] += _sources("cu")
    # QCOMM_CUDA_SM<arch> records what was compiled, for qcomm._C.cuda_archs() and the tests
    marks = ["-DQCOMM_WITH_CUDA=1"] + [f"-DQCOMM_CUDA_SM{a}=1" for a in archs if a]
    kwargs["extra_compile_args"] = {
        "cxx": CXX_FLAGS + marks,
        "nvcc": NVCC_FLAGS + gencode + marks,
    }
    hooks["extra_compile_args"] = {"cxx": CXX_FLAGS + marks}
    Extension = cpp_extension.CUDAExtension
else:
    kwargs["extra_compile_args"] = {"cxx": CXX_FLAGS}
    hooks["extra_compile_args"] = {"cxx": CXX_FLAGS}
    Extension = cpp_extension.CppExtension
ext_modules = [Extension(**kwargs)]
if TEST_HOOKS:
    ext_modules.append(Extension(**hooks))


class HooksLinkedToC(cpp_extension.BuildExtension.with_options(use_ninja=True)):
    """Builds qcomm._C, then qcomm._testing from csrc/testing/ alone, linked against that _C: the
    product's code (nvcc's minutes of it included) is compiled once, and the hooks reach the
    same static state as the module users import (QncclBackend's count of live objects, the
    settings read, the CPU codec's instruction set). The dynamic loader finds _C beside the hooks
    ($ORIGIN, where both are installed or copied in place) and maps the one copy Python loaded.
    The hooks' objects go to a folder of their own, so that _C's build.ninja, which
    scripts/simt_check.sh asks which objects are up to date, stays _C's."""

    def build_extension(self, ext):
        if ext.name != "qcomm._testing":
            return super().build_extension(ext)
        lib = self.get_ext_fullpath("qcomm._C")
        ext.extra_link_args = ext.extra_link_args + [
            "-L" + os.path.dirname(lib),
            "-l:" + os.path.basename(lib),
            "-Wl,-rpath,$ORIGIN",
        ]
        ext.depends = ext.depends + [lib]  # a relinked _C relinks the hooks
        temp = self.build_temp
        self.build_temp = os.path.join(temp, "testing")
        try:
            return super().build_extension(ext)
        finally:
            self.build_temp = temp


def _build_base() -> str:
    given = os.environ.get("QCOMM_BUILD_DIR", "").strip()
    if given:
        return given
    if "build_ext" in sys.argv and "--inplace" in sys.argv:
        return os.path.join(ROOT, "build")
    tag = hashlib.sha1(ROOT.encode()).hexdigest()[:10]
    return os.path.join(tempfile.gettempdir(), f"qcomm-build-{tag}")


setup(
    name="qcomm",
    version="0.1.0",
    packages=["qcomm"],
    py_modules=["qcomm_autoload"],
    package_data={"qcomm": ["py.typed"]},
    # torch calls it at `import torch`: init_process_group("qnccl") without `import qcomm`
    entry_points={"torch.backends": ["qcomm = qcomm_autoload:register"]},
    ext_modules=ext_modules,
    cmdclass={"build_ext": HooksLinkedToC},
    python_requires=">=3.9",
    install_requires=["torch==2.11.*"],
    options={"build": {"build_base": _build_base()}},
)
