# log_softmax's input gradient against float64 autograd, avo's and torch's own, per dtype:
# 256 rows of 1000, x = 3 * randn and a randn incoming gradient, rounded to the dtype.
#   PYTHONPATH=<build> python gradient_accuracy.py > accuracy_<build>.json
import json

import torch

import avo_ops

torch.manual_seed(0)
out = {}
for name, dtype in [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)]:
    x = (torch.randn(256, 1000, dtype=torch.float64) * 3).to(dtype)
    dy = torch.randn(256, 1000, dtype=torch.float64).to(dtype)
    x64 = x.double().requires_grad_()
    (exact,) = torch.autograd.grad(torch.log_softmax(x64, -1), x64, dy.double())
    rounded = exact.to(dtype).double()
    res = {}
    for impl, f in [("avo", avo_ops.log_softmax), ("torch", lambda a: torch.log_softmax(a, -1))]:
        leaf = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(f(leaf), leaf, dy)
        err = (g.double() - exact).abs()
        res[impl] = dict(max_err_rel_to_max=(err.max() / exact.abs().max()).item(),
                         rms_err_rel=(err.pow(2).mean().sqrt() / exact.pow(2).mean().sqrt()).item(),
                         not_correctly_rounded=int((g.double() != rounded).sum()))
    out[name] = res
print(json.dumps(out, indent=1))
