#!/usr/bin/env python3
"""PyTorch peer of `tgc bench --generate`: greedy generation with a static KV cache.

The same GPT as tests/reference/parity.py (GPT-2- or Llama-shaped: RoPE, grouped-query
attention with a cache of KV heads), from a tgc checkpoint, in BF16 on the GPU, written
as gpt-fast writes it: the caches are buffers [B, H, seq_len, Dh], a prompt runs as one forward
pass (prefill, F.scaled_dot_product_attention, causal) that fills them, then each step runs one
token per sequence against the whole cache under a mask of the positions written so far. With
--compile the step is torch.compile(mode="reduce-overhead") (CUDA graphs) and the prefill
torch.compile; the greedy token is taken on the device. Prints prefill and decode times as
`tgc bench --generate` does (medians of --runs runs after one warm-up).

  tgc train models/gpt2-124m.yaml --device cpu --steps 0 --save init.safetensors
  python3 tests/reference/generate_peer.py init.safetensors --batch 1 --prompt-length 16 \
      --tokens 240 --compile
"""
import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity import Rng, kv_heads, load, mix64, mlp_residual, read_config, rope, rope_tables  # noqa: E402


class Generator(torch.nn.Module):
    def __init__(self, cfg, weights, batch, device):
        super().__init__()
        self.cfg = cfg
        self.w = {name: t.to(device, torch.bfloat16) for name, t in weights.items()}
        L, H, T, D = cfg["layers"], cfg["heads"], cfg["seq_len"], cfg["d_model"]
        for l in range(L):  # the caches hold KV heads (grouped-query attention: fewer than H)
            for kind in ("k", "v"):
                self.register_buffer(f"{kind}{l}", torch.zeros(batch, kv_heads(cfg), T, D // H, dtype=torch.bfloat16,
                                                               device=device))
        self.register_buffer("causal", torch.ones(T, T, dtype=torch.bool, device=device).tril())
        if cfg.get("position") == "rope":
            cos, sin = rope_tables(cfg, T)
            self.register_buffer("rope_cos", cos.to(device))
            self.register_buffer("rope_sin", sin.to(device))

    def linear(self, x, name):
        return F.linear(x, self.w[name + ".weight"], self.w.get(name + ".bias"))

    def norm(self, x, name):
        c = self.cfg
        if c["norm"] == "rmsnorm":
            return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + c["norm_eps"]).to(x.dtype) * self.w[name + ".weight"]
        return F.layer_norm(x, (c["d_model"],), self.w[name + ".weight"], self.w.get(name + ".bias"), c["norm_eps"])

    def forward(self, tokens, positions):
        """tokens [B, S] at positions [S] (the same for every sequence): the caches' rows
        written, each position attending to the cache up to itself; the greedy next token of
        the last position."""
        c = self.cfg
        B, S = tokens.shape
        D, H, KV = c["d_model"], c["heads"], kv_heads(c)
        Dh, use_rope, gqa = D // H, c.get("position") == "rope", KV != H
        x = self.w["wte"][tokens]
        if not use_rope:
            x = x + self.w["wpe"][positions]
        mask = self.causal[positions][None, None]  # [1, 1, S, T]
        for l in range(c["layers"]):
            h = f"h{l}"
            qkv = self.linear(self.norm(x, h + ".ln1"), h + ".attn.qkv")
            q, k, v = qkv.split([D, KV * Dh, KV * Dh], dim=2)
            q = q.view(B, S, H, Dh).transpose(1, 2)
            k, v = (t.view(B, S, KV, Dh).transpose(1, 2) for t in (k, v))
            if use_rope:  # in BF16, at the positions written
                cos, sin = self.rope_cos[positions].to(q.dtype), self.rope_sin[positions].to(q.dtype)
                q, k = rope(q, cos, sin), rope(k, cos, sin)
            kc, vc = getattr(self, f"k{l}"), getattr(self, f"v{l}")
            kc[:, :, positions] = k
            vc[:, :, positions] = v
            if S > 1:  # a prompt: causal attention over its own positions (from 0)
                ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            else:
                ctx = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=gqa)
            x = x + self.linear(ctx.transpose(1, 2).reshape(B, S, D), h + ".attn.proj")
            x = mlp_residual(c, x, h, self.linear, self.norm)
        head = self.w["wte"] if c["tie_embeddings"] else self.w["lm_head.weight"]
        return F.linear(self.norm(x[:, -1], "lnf"), head).argmax(-1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=240)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    weights, meta = load(args.checkpoint)
    cfg = read_config(meta["model"])
    device = torch.device("cuda")
    B, P, N = args.batch, args.prompt_length, args.tokens
    assert P + N - 1 <= cfg["seq_len"], "prompt + tokens - 1 must fit seq_len"
    model = Generator(cfg, weights, B, device)
    rng = Rng(mix64(cfg.get("seed", 0)))
    prompts = torch.tensor([[rng.below(cfg["vocab"]) for _ in range(P)] for _ in range(B)], device=device)
    prefill, step = model, model
    if args.compile:
        prefill = torch.compile(model)
        step = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    prompt_positions = torch.arange(P, device=device)

    def run():
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            token = prefill(prompts, prompt_positions)
            out = [token]
            torch.cuda.synchronize()
            middle = time.perf_counter()
            position = torch.tensor([P], device=device)
            for n in range(1, N):
                if args.compile:  # the CUDA graphs' outputs are reused by the next replay
                    torch.compiler.cudagraph_mark_step_begin()
                token = step(token.view(B, 1), position).clone()
                out.append(token)
                position = position + 1
            torch.cuda.synchronize()
        end = time.perf_counter()
        return middle - start, end - middle, torch.stack(out, 1)

    run()  # compiles, captures
    prefills, decodes = [], []
    for _ in range(args.runs):
        p, d, tokens = run()
        prefills.append(p)
        decodes.append(d)
    prefill_ms, decode_s = statistics.median(prefills) * 1e3, statistics.median(decodes)
    mode = "torch.compile" if args.compile else "eager"
    print(f"pytorch bf16 {mode}, static KV cache, {torch.cuda.get_device_name()}: batch {B}, prompts of {P}, "
          f"{N} new tokens: prefill {prefill_ms:.2f} ms ({B * P / prefill_ms * 1e3:.0f} prompt tok/s), "
          f"{decode_s / max(N - 1, 1) * 1e3:.3f} ms a step, {B * (N - 1) / decode_s:.0f} decode tok/s, "
          f"{B * N / (decode_s + prefill_ms / 1e3):.0f} overall tok/s; first tokens {tokens[0, :8].tolist()}")


if __name__ == "__main__":
    main()
