# Kernel times of the bf16 backwards with parameter gradients: torch.profiler (CUDA
# activity) around 10 torch.autograd.grad calls per case, 64 Mi elements per input.
#   PYTHONPATH=. python3 benchmarks/results/2026-12-02-h200-simplified-sums/profile_bwd.py
import torch
import avo_ops  # noqa: F401
from torch.profiler import ProfilerActivity, profile

elements = 1 << 26
for op in ("layernorm", "rmsnorm", "swish_layernorm", "add_layernorm"):
    for n in (256, 1024, 4096, 16384):
        x = torch.randn(elements // n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        fn = getattr(avo_ops, op)
        if op == "rmsnorm":
            out = fn(x, w)
        elif op == "add_layernorm":
            out = fn(x, torch.randn_like(x), w, torch.zeros_like(w, requires_grad=True))
        else:
            out = fn(x, w, torch.zeros_like(w, requires_grad=True))
        outs = out if isinstance(out, tuple) else (out,)
        grads = [torch.randn_like(o) for o in outs]
        leaves = [x, w]
        for _ in range(3):
            torch.autograd.grad(outs, leaves, grads, retain_graph=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                torch.autograd.grad(outs, leaves, grads, retain_graph=True)
            torch.cuda.synchronize()
        rows = []
        for e in prof.key_averages():
            if e.device_type.name == "CUDA" and e.count >= 10:
                rows.append((e.device_time_total / e.count, e.count // 10, e.key[:60]))
        rows.sort(reverse=True)
        total = sum(t * c for t, c, _ in rows)
        print(f"{op} bf16 N={n}: " + "; ".join(f"{k} {t:.1f}us x{c}" for t, c, k in rows[:4]) + f"; sum {total:.1f}us")
