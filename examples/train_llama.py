"""Train a small Llama-style model for a few steps, without and with avo_ops, and print
tokens/s and peak memory for both.

    python examples/train_llama.py                  # GPU, bf16, ~0.5B parameters
    python examples/train_llama.py --compile        # the same under torch.compile
    python examples/train_llama.py --tiny --device cpu --steps 2   # a quick smoke run

Both runs start from the same random weights and see the same random tokens (no
downloads: the model is built from a config). `avo_ops.patch(model)` swaps the
RMSNorm and SiLU modules of the built model for the avo kernels; the training loop is
the same code for both. The loss of the first step is printed for both runs, so that
one sees they train the same model.

Needs `transformers` (pip install transformers).
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import avo_ops

CONFIGS = {
    # about 0.5B parameters: 8 layers of width 2048 (MLP 5632), grouped-query attention
    "default": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                    num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096),
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128),
}


def build_model(config_name: str, device: str, dtype: torch.dtype):
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**CONFIGS[config_name])
    return transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype)


def train(args, use_avo: bool) -> dict:
    device, dtype = args.device, getattr(torch, args.dtype)
    model = build_model("tiny" if args.tiny else "default", device, dtype)
    model.train()
    report = avo_ops.patch(model) if use_avo else None
    step_fn = torch.compile(model) if args.compile else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    generator = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    batches = [torch.randint(0, vocab, (args.batch, args.seq + 1), generator=generator).to(device)
               for _ in range(4)]

    def step(i: int) -> torch.Tensor:
        tokens = batches[i % len(batches)]
        logits = step_fn(input_ids=tokens[:, :-1]).logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    first_loss = step(0).item()  # also the warm-up (and, with --compile, the compilation)
    for i in range(1, args.warmup):
        step(i)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for i in range(args.steps):
        step(args.warmup + i)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    result = {
        "name": "avo_ops" if use_avo else "torch",
        "tokens_per_s": args.steps * args.batch * args.seq / seconds,
        "peak_memory_gib": None if peak is None else peak / 2**30,
        "first_loss": first_loss,
        "replaced": len(report.replaced) if report else 0,
    }
    del model, optimizer, step_fn
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model in both runs")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model of width 64 (smoke test)")
    args = parser.parse_args()
    if args.tiny:
        args.seq = min(args.seq, 64)
    args.warmup = max(args.warmup, 1)

    print(f"Llama-style model ({'tiny' if args.tiny else 'default'} config), {args.dtype} on {args.device}, "
          f"batch {args.batch} x {args.seq} tokens, {args.steps} timed steps after {args.warmup}"
          f"{', torch.compile' if args.compile else ''}")
    results = [train(args, use_avo=False), train(args, use_avo=True)]
    print(f"{'':8} {'tokens/s':>12} {'peak memory':>12} {'first loss':>11}  modules replaced")
    for r in results:
        memory = "-" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.2f} GiB"
        print(f"{r['name']:8} {r['tokens_per_s']:12.0f} {memory:>12} {r['first_loss']:11.4f}  {r['replaced']}")
    base, avo = results
    print(f"ratio avo_ops/torch: {avo['tokens_per_s'] / base['tokens_per_s']:.3f}x tokens/s"
          + ("" if base["peak_memory_gib"] is None else
             f", {avo['peak_memory_gib'] / base['peak_memory_gib']:.3f}x peak memory"))


if __name__ == "__main__":
    main()
