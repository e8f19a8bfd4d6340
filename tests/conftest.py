"""Shared test parameters: devices and dtypes, and the per-dtype tolerances."""
from __future__ import annotations

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
