"""A short tour of avo_ops: ops generated from specs/*.yaml, called like any torch op.

    python examples/quickstart.py
"""
import time

import torch
import torch.nn.functional as F

import avo_ops

device = "cuda" if torch.cuda.is_available() else "cpu"
print(f"avo_ops {avo_ops.__version__} on {device} (CUDA kernels built: {avo_ops.built_with_cuda()})")
print(f"ops from specs: {', '.join(f'{name} ({spec})' for name, spec in avo_ops.OPS.items())}")

# 1. The registered op and the functional API, against torch.
x = torch.randn(4096, 1024, device=device, requires_grad=True)
y = torch.ops.avo.gelu(x)
print(f"gelu      max |avo - torch| = {(y - F.gelu(x)).abs().max().item():.2e}")
y_tanh = avo_ops.gelu(x, approximate="tanh")
print(f"gelu tanh max |avo - torch| = {(y_tanh - F.gelu(x, approximate='tanh')).abs().max().item():.2e}")

# 2. Gradients come from the backward kernel the generator derived from the math.
(grad,) = torch.autograd.grad(torch.ops.avo.silu(x).sum(), x)
(expected,) = torch.autograd.grad(F.silu(x).sum(), x)
print(f"silu grad max |avo - torch| = {(grad - expected).abs().max().item():.2e}")

# 3. Low precision: loads and stores in bfloat16, computes in fp32.
xb = x.detach().to(torch.bfloat16)
reference = F.silu(xb.double())
err = ((torch.ops.avo.silu(xb).double() - reference).abs() / reference.abs().clamp_min(1e-3)).max().item()
print(f"silu bf16 max relative error against float64: {err:.2e} (rounding to bf16 alone allows 3.9e-03)")


# 4. torch.compile traces straight through (fake implementations, autograd registration).
@torch.compile(fullgraph=True)
def mlp_activation(h):
    return torch.ops.avo.silu(h) * avo_ops.gelu(h)


out = mlp_activation(x)
out.sum().backward()
print(f"torch.compile(fullgraph=True): output {tuple(out.shape)}, grad {tuple(x.grad.shape)}")

# 5. A rough timing (benchmarks/bench_ops.py does this properly).
if device == "cuda":
    big = torch.randn(16384, 4096, device=device, dtype=torch.bfloat16)
    for name, fn in (("avo", torch.ops.avo.gelu), ("torch", F.gelu)):
        fn(big)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            fn(big)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - start) / 20 * 1e3
        print(f"gelu bf16 16384x4096, {name:5s}: {ms:.3f} ms ({2 * big.numel() * 2 / ms / 1e6:.0f} GB/s)")
