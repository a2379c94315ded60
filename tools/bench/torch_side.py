#!/usr/bin/env python3
"""torch_side.py - PyTorch's speed on a devio model directory, for devio's figures to stand beside:
the same Hugging Face Llama weights (a devio-mkmodel directory, bf16) run by transformers on one
device, measured the way devio-bench measures devio.

Usage: python3 tools/bench/torch_side.py --model DIR [--device cuda] [--prefill 2048]
           [--decode 64] [--dtype bf16]

Prints one JSON line:
  prefill_tok_s          one forward pass over --prefill tokens, logits of the last position only
                         (what devio-bench's prefill asks of devio), best of 3 after a warm-up;
  decode_b1_tok_s        greedy decode of batch 1 with transformers' generate and its dynamic cache:
                         (time of 1 + --decode new tokens - time of 1) / --decode, best of 3;
  decode_b1_static_tok_s the same with cache_implementation="static" (a preallocated cache);
  matmuls_b1_tok_s       plain torch matmuls: one token through every linear weight of the model in
                         order (x @ W^T, nothing else), the weight-streaming floor of eager PyTorch;
and the versions of torch and transformers. A figure that cannot be had (an older transformers, no
static cache) is null with the reason under "why". Asserts nothing.
"""
import argparse
import json
import time


def timed(torch, fn, reps=3):
    """Best wall time of fn over reps runs after one warm-up, synchronised on the device."""
    fn()
    best = float("inf")
    for _ in range(reps):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--dtype", choices=("bf16", "f16", "f32"), default="bf16")
    a = ap.parse_args()

    import torch
    import transformers

    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    try:
        m = transformers.LlamaForCausalLM.from_pretrained(a.model, dtype=dtype)
    except TypeError:
        m = transformers.LlamaForCausalLM.from_pretrained(a.model, torch_dtype=dtype)
    m = m.to(a.device).eval()
    vocab = m.config.vocab_size
    ids = torch.tensor([[(i * 7919 + 13) % vocab for i in range(a.prefill)]], device=a.device)
    out = {"torch": torch.__version__, "transformers": transformers.__version__,
           "device": torch.cuda.get_device_name() if a.device == "cuda" else a.device,
           "dtype": a.dtype, "prefill_tokens": a.prefill, "decode_tokens": a.decode, "why": {}}

    with torch.inference_mode():
        def prefill():
            try:
                m(ids, logits_to_keep=1, use_cache=False)
            except TypeError:  # transformers before logits_to_keep
                m(ids, use_cache=False)
        out["prefill_tok_s"] = round(a.prefill / timed(torch, prefill), 1)

        prompt = ids[:, :16]
        for key, extra in (("decode_b1_tok_s", {}),
                           ("decode_b1_static_tok_s", {"cache_implementation": "static"})):
            def gen(n):
                return lambda: m.generate(prompt, max_new_tokens=n, min_new_tokens=n,
                                          do_sample=False, pad_token_id=0, **extra)
            try:
                dt = timed(torch, gen(1 + a.decode)) - timed(torch, gen(1))
                out[key] = round(a.decode / dt, 1) if dt > 0 else None
            except Exception as e:  # noqa: BLE001 - reported, not raised
                out[key] = None
                out["why"][key] = "%s: %s" % (type(e).__name__, str(e)[:200])

        weights = [mod.weight for mod in m.modules() if isinstance(mod, torch.nn.Linear)]
        xs = {w.shape[1]: torch.randn(1, w.shape[1], dtype=dtype, device=a.device)
              for w in weights}

        def matmuls():
            for w in weights:
                xs[w.shape[1]] @ w.t()
        out["matmuls_b1_tok_s"] = round(1.0 / timed(torch, matmuls, reps=5), 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
