"""Shared test parameters: devices and dtypes, the per-dtype tolerances, and the CUDA row
kernel versions a test can force its calls onto."""
from __future__ import annotations

import contextlib

import pytest
import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# Tolerances against a float64 reference computed on the same (already rounded) inputs.
# The kernels compute in fp32, so the error is dominated by rounding the result to the
# output dtype, at most 2^-8 relative for bfloat16 and 2^-11 for float16 (half an ulp);
# the tolerances allow four times that. fp32 leaves room for a few ulps of erf/exp/tanh.
# The absolute part covers results near zero.
TOLERANCES = {
    torch.float32: dict(rtol=2e-5, atol=1e-6),
    torch.float16: dict(rtol=2e-3, atol=1e-5),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-5),
}


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(params=DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def dtype(request):
    return request.param


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# The CUDA row kernel versions (avo/row_cuda.cuh) a test forces every call onto
# (avo_ops._C.set_row_version), and "auto", the dispatch table's choice. The tiled
# version, for backwards with per-column sums only, is added where a test runs those.
ROW_VERSIONS = ("register", "pipelined", "wide", "narrow", "staged", "cluster", "global", "auto")


@contextlib.contextmanager
def forced(setter, name):
    """A choice of the CUDA row kernels (avo_ops._C.set_row_version, set_chunk_size,
    set_cluster_blocks, set_tiled_kernels or set_row_prefetch) forced to `name` for the
    block, then given back to the table ('auto')."""
    setter(name)
    try:
        yield
    finally:
        setter("auto")


@pytest.fixture
def row_version(request):
    """Every call of the test forced onto the version `request.param` (where the call can
    take it: a row too long for registers or shared memory takes the next one)."""
    import avo_ops  # here, not above: the generator's tests run without the built extension

    with forced(avo_ops._C.set_row_version, request.param):
        yield request.param
