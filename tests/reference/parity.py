#!/usr/bin/env python3
"""PyTorch peer of tgc's fp32 training, for parity tests.

Builds the same GPT in plain PyTorch, loads tgc's initial weights from a tgc checkpoint
(safetensors, the names documented in the README), draws the same batches (tgc's arithmetic data
stream, reimplemented below), trains with torch.optim.AdamW and clip_grad_norm_ under tgc's
schedule, and writes the per-step losses as JSON. With --generate it instead loads a trained
checkpoint and prints greedy continuations of a prompt, to compare with `tgc generate`.

  tgc train tests/reference/tiny-parity.yaml --steps 0 --save init.safetensors
  python3 tests/reference/parity.py init.safetensors --config tests/reference/tiny-parity.yaml \
      --steps 20 --out losses.json
  python3 tests/reference/parity.py trained.safetensors --generate "5 12 19" --tokens 16
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from safetensors import safe_open

MASK = (1 << 64) - 1
E4M3_MAX, E5M2_MAX = 448.0, 57344.0


def mix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


class Rng:
    """tgc's support/Random.h."""

    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        value = mix64(self.state)
        self.state = (self.state + 1) & MASK
        return value

    def below(self, n):
        return self.next() % n


def is_eval_pair(a, k):
    return mix64((a * 1000003 + k) & MASK) % 8 == 0


def train_batch(cfg, index):
    """tgc's ArithmeticData::trainBatch."""
    vocab, seq, batch = cfg["vocab"], cfg["seq_len"], cfg["batch"]
    lo, hi = cfg["min_step"], cfg["max_step"]
    rng = Rng((mix64(cfg["seed"] ^ 0x5EED0DA7A) + index * 0x9E3779B97F4A7C15) & MASK)
    tokens, targets = [], []
    for _ in range(batch):
        for _ in range(1000):
            a = rng.below(vocab)
            k = lo + rng.below(hi - lo + 1)
            if not is_eval_pair(a, k):
                break
        s = [(a + k * i) % vocab for i in range(seq + 1)]
        tokens.append(s[:-1])
        targets.append(s[1:])
    return torch.tensor(tokens), torch.tensor(targets)


def learning_rate(cfg, step):
    """tgc's backends/cpu/Schedule.h."""
    lr, warmup, steps = cfg["lr"], cfg["warmup"], cfg["steps"]
    min_lr = lr * cfg["min_lr_ratio"]
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    if steps <= warmup:
        return lr
    progress = min(1.0, (step - warmup) / (steps - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))


def read_config(model_yaml):
    """The flat model description tgc stores in checkpoint metadata (two levels, key: value)."""
    cfg = {}
    for line in model_yaml.splitlines():
        if ":" not in line or not line.startswith("  "):
            continue
        key, value = (part.strip() for part in line.split(":", 1))
        for convert in (int, float):
            try:
                value = convert(value)
                break
            except ValueError:
                pass
        if value in ("true", "false"):
            value = value == "true"
        cfg[key] = value
    return cfg


class DelayedScaling:
    """Transformer Engine's DelayedScaling state of one tensor (../shared/fp8.md): the producer
    records amax in the current slot; after the step the scale follows the window's max."""

    def __init__(self, fmt_max, history, device):
        self.fmt_max = fmt_max
        self.scale = torch.ones((), device=device)
        self.history = torch.zeros(history, device=device)

    def quantize(self, x, dtype):
        self.history[0] = x.detach().abs().amax().float()
        # torch's float8 casts round to nearest even but do not saturate: clamp first.
        q = (x.float() * self.scale).clamp(-self.fmt_max, self.fmt_max).to(dtype)
        return q, self.scale.reciprocal()

    def update(self):
        amax = self.history.max()
        self.history = torch.roll(self.history, -1)
        self.history[0] = 0
        ok = torch.isfinite(amax) & (amax > 0)
        self.scale = torch.where(ok, self.fmt_max / torch.where(ok, amax, 1.0), self.scale)


class Fp8Linear(torch.autograd.Function):
    """y = x W^T + b with E4M3 x and W, and E5M2 gradients (hybrid), through torch._scaled_mm,
    which takes A row-major and B column-major (cuBLASLt's TN): the backward materialises the
    transposes, as tgc's legalize-fp8-gemm does."""

    @staticmethod
    def forward(ctx, x, weight, bias, state):
        shape = x.shape
        xq, xs = state["input"].quantize(x.reshape(-1, shape[-1]), torch.float8_e4m3fn)
        wq, ws = state["weight"].quantize(weight, torch.float8_e4m3fn)
        y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.float32)
        if bias is not None:
            y = y + bias.float()
        ctx.save_for_backward(xq, wq, xs, ws)
        ctx.state, ctx.shape, ctx.has_bias = state, shape, bias is not None
        return y.reshape(*shape[:-1], -1)

    @staticmethod
    def backward(ctx, dy):
        xq, wq, xs, ws = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])
        dyq, dys = ctx.state["grad_output"].quantize(dy2, torch.float8_e5m2)
        dx = torch._scaled_mm(dyq, wq.t().contiguous().t(), scale_a=dys, scale_b=ws, out_dtype=torch.float32)
        dw = torch._scaled_mm(dyq.t().contiguous(), xq.t().contiguous().t(), scale_a=dys, scale_b=xs,
                              out_dtype=torch.float32)
        db = dy2.float().sum(0) if ctx.has_bias else None
        return dx.reshape(ctx.shape), dw, db, None


def fp8_layers(cfg, min_dim, device):
    """tgc's rule (transforms/precision/Precision.h): FP8 for a linear layer but the head when M, K and N are
    multiples of 16 and K and N reach fp8_min_dim. Scaling state for each."""
    d, ffn, m = cfg["d_model"], cfg["ffn"], cfg["batch"] * cfg["seq_len"]
    up = 2 * ffn if cfg["activation"] == "swiglu" else ffn
    qkv = d + 2 * kv_heads(cfg) * (d // cfg["heads"])
    shapes = {}
    for l in range(cfg["layers"]):
        shapes.update({f"h{l}.attn.qkv": (d, qkv), f"h{l}.attn.proj": (d, d), f"h{l}.mlp.fc1": (d, up),
                       f"h{l}.mlp.fc2": (ffn, d)})
    history = cfg.get("amax_history_len", 1024)
    layers = {}
    for name, (k, n) in shapes.items():
        if m % 16 or k % 16 or n % 16 or k < min_dim or n < min_dim:
            continue
        layers[name] = {"input": DelayedScaling(E4M3_MAX, history, device),
                        "weight": DelayedScaling(E4M3_MAX, history, device),
                        "grad_output": DelayedScaling(E5M2_MAX, history, device)}
    return layers


def kv_heads(cfg):
    """Heads of keys and values (tgc's kv_heads; absent: every query head its own)."""
    return cfg.get("kv_heads", 0) or cfg["heads"]


def rope_frequency(cfg, i, Dh):
    """Pair i's frequency: theta^(-2i/Dh), under rope_scaling: llama3 scaled as Hugging Face's
    _compute_llama3_parameters scales it (tgc's ir/Rope.h ropeFrequency)."""
    f = cfg["rope_theta"] ** (-2.0 * i / Dh)
    if cfg.get("rope_scaling") != "llama3":
        return f
    factor, low, high = cfg["rope_factor"], cfg["rope_low_freq_factor"], cfg["rope_high_freq_factor"]
    original = cfg["rope_original_length"]
    wavelength = 2 * math.pi / f
    if wavelength < original / high:
        return f
    if wavelength > original / low:
        return f / factor
    smooth = (original / wavelength - low) / (high - low)
    return (1 - smooth) * f / factor + smooth * f


def rope_tables(cfg, T):
    """Llama's rotary angles for positions 0..T-1: t * rope_frequency(i) for the Dh/2 pairs, in
    double, their cos and sin rounded to float (tgc's ir/Rope.h), each [T, Dh/2]."""
    Dh = cfg["d_model"] // cfg["heads"]
    half = Dh // 2
    inv = torch.tensor([rope_frequency(cfg, i, Dh) for i in range(half)], dtype=torch.float64)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    return angle.cos().float(), angle.sin().float()


def rope(x, cos, sin):
    """The rotary embedding, rotate-half pairing, on x [B, H, T, Dh]: position t's pair
    (i, i + Dh/2) rotated by the angle whose cos and sin are row t of the tables."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def mlp_residual(cfg, x, h, linear, norm):
    """x plus block h's MLP of its second norm (tanh GELU, or SwiGLU with fc1's gate then up
    halves), as tgc's builder has it; `linear` and `norm` are the model's own."""
    u = linear(norm(x, h + ".ln2"), h + ".mlp.fc1")
    if cfg["activation"] == "swiglu":
        gate, up = u.split(cfg["ffn"], dim=-1)
        act = F.silu(gate) * up
    else:
        act = F.gelu(u, approximate="tanh")
    return x + linear(act, h + ".mlp.fc2")


class GPT(torch.nn.Module):
    """tgc's GPT: pre-LayerNorm blocks, tanh GELU, weights [out, in]."""

    def __init__(self, cfg, weights, fp8=None, sdpa=False):
        super().__init__()
        self.cfg = cfg
        self.fp8 = fp8 or {}
        self.sdpa = sdpa  # PyTorch's fused attention (FlashAttention or cuDNN), as a user would write it
        self.checkpoint_blocks = False
        self.p = torch.nn.ParameterDict(
            {name.replace(".", "__"): torch.nn.Parameter(t.clone()) for name, t in weights.items()})
        if cfg.get("position") == "rope":  # the tables made once, as Hugging Face's models keep them
            cos, sin = rope_tables(cfg, cfg["seq_len"])
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def has(self, name):
        return name.replace(".", "__") in self.p

    def use_torchao(self):
        """torchao's float8 training (tensorwise dynamic scaling, its default recipe): each linear
        layer an nn.Linear over the same parameters, swapped for torchao's Float8Linear by
        convert_to_float8_training, as a torchao user converts a model (the LM head stays BF16,
        as tgc's keep_bf16 keeps it)."""
        from torchao.float8 import convert_to_float8_training
        self.lin = torch.nn.ModuleDict()
        for key in list(self.p.keys()):
            name = key.replace("__", ".")
            if not name.endswith(".weight") or (".attn." not in name and ".mlp." not in name):
                continue
            layer = name[:-len(".weight")]
            w = self.p[key]
            lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=self.has(layer + ".bias"), device="meta")
            lin.weight = w
            if self.has(layer + ".bias"):
                lin.bias = self.w(layer + ".bias")
            self.lin[layer.replace(".", "__")] = lin
        convert_to_float8_training(self.lin)

    def linear(self, x, name):
        bias = self.w(name + ".bias") if self.has(name + ".bias") else None
        if hasattr(self, "lin") and name.replace(".", "__") in self.lin:
            return self.lin[name.replace(".", "__")](x)
        if name in self.fp8:
            return Fp8Linear.apply(x, self.w(name + ".weight"), bias, self.fp8[name])
        return F.linear(x, self.w(name + ".weight"), bias)

    def norm(self, x, name):
        c = self.cfg
        if c["norm"] == "rmsnorm":
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["norm_eps"]) * self.w(name + ".weight")
        return F.layer_norm(x, (c["d_model"],), self.w(name + ".weight"), self.w(name + ".bias"), c["norm_eps"])

    def forward(self, tokens):
        c = self.cfg
        B, T = tokens.shape
        use_rope = c.get("position") == "rope"
        x = self.w("wte")[tokens]
        if not use_rope:
            x = x + self.w("wpe")[:T]
        mask = torch.ones(T, T, dtype=torch.bool, device=tokens.device).triu(1)
        for l in range(c["layers"]):
            if self.checkpoint_blocks:  # activation checkpointing: each block's inside made again
                x = torch.utils.checkpoint.checkpoint(self.block, x, l, mask, use_reentrant=False)
            else:
                x = self.block(x, l, mask)
        head = self.w("wte") if c["tie_embeddings"] else self.w("lm_head.weight")
        return F.linear(self.norm(x, "lnf"), head)

    def block(self, x, l, mask):
        c = self.cfg
        B, T, D = x.shape
        H, KV = c["heads"], kv_heads(c)
        Dh, use_rope = D // H, c.get("position") == "rope"
        h = f"h{l}"
        qkv = self.linear(self.norm(x, h + ".ln1"), h + ".attn.qkv")
        q, k, v = qkv.split([D, KV * Dh, KV * Dh], dim=2)
        q = q.view(B, T, H, Dh).transpose(1, 2)
        k, v = (t.view(B, T, KV, Dh).transpose(1, 2) for t in (k, v))
        if use_rope:
            cos, sin = self.rope_cos[:T], self.rope_sin[:T]
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        if self.sdpa:  # query head h reads KV head h // (H / KV), as enable_gqa does
            ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=KV != H)
            ctx = ctx.transpose(1, 2).reshape(B, T, D)
        else:
            if KV != H:  # Llama's repeat_kv
                k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(D // H)
            probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
            ctx = (probs @ v).transpose(1, 2).reshape(B, T, D)
        x = x + self.linear(ctx, h + ".attn.proj")
        return mlp_residual(c, x, h, self.linear, self.norm)


def decays(name, cfg):
    """tgc's builder marks linear weights and the LM head for decay; embeddings unless asked."""
    if name in ("wte", "wpe"):
        return cfg.get("decay_embeddings", False)
    return name.endswith(".weight") and (".attn." in name or ".mlp." in name or name == "lm_head.weight")


def make_optimizer(model, names, cfg, **kwargs):
    """torch.optim.AdamW with tgc's decay groups and hyperparameters."""
    groups = [
        {"params": [model.w(n) for n in names if decays(n, cfg)], "weight_decay": cfg["weight_decay"]},
        {"params": [model.w(n) for n in names if not decays(n, cfg)], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"],
                             **kwargs)


def load(path):
    weights, meta = {}, None
    with safe_open(path, framework="pt") as f:
        meta = json.loads(f.metadata()["tgc"])
        for name in f.keys():
            if ".adam_" not in name:
                weights[name] = f.get_tensor(name)
    return weights, meta


def train(args):
    weights, meta = load(args.checkpoint)
    # The schedule comes from the model file: the checkpoint saved at step 0 says steps: 0.
    cfg = read_config(meta["model"])
    with open(args.config) as f:
        cfg.update(read_config(f.read()))
    if args.batch:
        cfg["batch"] = args.batch
    # --device cuda: fp32 on the GPU (no TF32), for models the CPU is too slow for.
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    model = GPT(cfg, weights).to(device)
    opt = make_optimizer(model, list(weights.keys()), cfg, foreach=False)
    losses = []
    for step in range(1, args.steps + 1):
        tokens, targets = (t.to(device) for t in train_batch(cfg, step - 1))
        logits = model(tokens)
        loss = F.cross_entropy(logits.view(-1, cfg["vocab"]), targets.view(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"], foreach=False)
        for g in opt.param_groups:
            g["lr"] = learning_rate(cfg, step)
        opt.step()
        losses.append(loss.item())
        print(f"step {step:3d} loss {loss.item():.6f}", file=sys.stderr)
    name = os.path.splitext(os.path.basename(args.config))[0]
    out = {"model": name, "steps": args.steps,
           "torch": torch.__version__, "losses": losses}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


@torch.no_grad()
def generate(args):
    weights, meta = load(args.checkpoint)
    cfg = read_config(meta["model"])
    model = GPT(cfg, weights)
    seq = [int(t) for t in args.generate.replace(",", " ").split()]
    out = []
    for _ in range(args.tokens):
        window = seq[-cfg["seq_len"]:]
        logits = model(torch.tensor([window]))
        nxt = int(logits[0, -1].argmax())
        seq.append(nxt)
        out.append(nxt)
    print(" ".join(map(str, out)))


# tgc's defaults (models/ModelConfig.h) for what a model file may leave out.
TRAIN_DEFAULTS = {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "grad_clip": 1.0, "min_lr_ratio": 0.1,
                  "min_step": 1, "max_step": 8, "weight_decay": 0.1, "norm_eps": 1e-5}


def random_weights(cfg):
    """Weights of tgc's names and shapes for `cfg`, drawn on the GPU (normal, std 0.02; norms 1,
    biases 0): for timing models whose checkpoint would be tens of gigabytes."""
    D, H, V, F_ = cfg["d_model"], cfg["heads"], cfg["vocab"], cfg["ffn"]
    Dh, KV = D // H, kv_heads(cfg)
    fc1 = 2 * F_ if cfg["activation"] == "swiglu" else F_
    bias, layernorm = cfg.get("bias", True), cfg["norm"] != "rmsnorm"
    shapes = {"wte": (V, D)}
    if cfg.get("position") != "rope":
        shapes["wpe"] = (cfg["seq_len"], D)
    linears = {"attn.qkv": ((H + 2 * KV) * Dh, D), "attn.proj": (D, D), "mlp.fc1": (fc1, D), "mlp.fc2": (D, F_)}
    norms = [f"h{l}.{n}" for l in range(cfg["layers"]) for n in ("ln1", "ln2")] + ["lnf"]
    for l in range(cfg["layers"]):
        for name, shape in linears.items():
            shapes[f"h{l}.{name}.weight"] = shape
            if bias:
                shapes[f"h{l}.{name}.bias"] = (shape[0],)
    if not cfg["tie_embeddings"]:
        shapes["lm_head.weight"] = (V, D)
    g = torch.Generator(device="cuda").manual_seed(cfg.get("seed", 0))
    weights = {name: torch.randn(shape, device="cuda", generator=g) * 0.02 for name, shape in shapes.items()}
    for n in norms:
        weights[n + ".weight"] = torch.ones(D, device="cuda")
        if layernorm:
            weights[n + ".bias"] = torch.zeros(D, device="cuda")
    return weights


def bench(args):
    """The PyTorch peer of `tgc bench`: the same model, batches and optimizer on the GPU."""
    import statistics
    import time
    if args.checkpoint == "random":  # a model too large for a checkpoint file: weights drawn here
        cfg = dict(TRAIN_DEFAULTS)
        weights = None
    else:
        weights, meta = load(args.checkpoint)
        cfg = read_config(meta["model"])
    if args.config:
        with open(args.config) as f:
            cfg.update(read_config(f.read()))
    if args.batch:
        cfg["batch"] = args.batch
    if weights is None:
        weights = random_weights(cfg)
    # --ddp (under torchrun --nproc_per_node N): DistributedDataParallel over N GPUs, each rank
    # its rows of the global batch, as tgc's --gpus N.
    rank, ranks = 0, 1
    if args.ddp:
        import torch.distributed as dist
        dist.init_process_group("nccl")
        rank, ranks = dist.get_rank(), dist.get_world_size()
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, as in tgc
    torch.backends.cudnn.allow_tf32 = False
    min_dim = args.fp8_min_dim if args.fp8_min_dim is not None else cfg.get("fp8_min_dim", 0)
    fp8 = fp8_layers(cfg, min_dim, device) if args.precision == "fp8" else {}
    model = GPT(cfg, {k: v.to(device) for k, v in weights.items()}, fp8, sdpa=True).to(device)
    names = list(weights.keys())
    del weights  # (the model holds its own copies: a 7B model's fp32 weights twice would not fit)
    model.checkpoint_blocks = args.checkpoint_activations
    if args.precision == "torchao":
        model.use_torchao()
    opt = make_optimizer(model, names, cfg, fused=True)
    # torch.compile (Inductor's Triton kernels) of the forward and the loss, what a user picks;
    # the warmup steps include its compilation.
    forward = model
    if args.ddp:
        from torch.nn.parallel import DistributedDataParallel
        forward = DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    if args.compile:
        forward = torch.compile(forward)
    total = args.warmup + args.steps
    share = cfg["batch"] // ranks  # this rank's rows
    batches = [tuple(t[rank * share:(rank + 1) * share].to(device) for t in train_batch(cfg, i))
               for i in range(total)]
    torch.cuda.reset_peak_memory_stats()
    times, loss, losses = [], None, []
    for step in range(1, total + 1):
        tokens, targets = batches[step - 1]
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision != "fp32"):
            logits = forward(tokens)
            loss = F.cross_entropy(logits.float().view(-1, cfg["vocab"]), targets.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        for g in opt.param_groups:
            g["lr"] = learning_rate(cfg, step)
        opt.step()
        for state in fp8.values():
            for s in state.values():
                s.update()
        torch.cuda.synchronize()
        if step > args.warmup:
            times.append((time.perf_counter() - start) * 1000)
        if args.losses:
            losses.append(loss.item())
    if args.profile:  # one more step under PyTorch's profiler: its kernels and ops by CUDA time
        from torch.profiler import ProfilerActivity, profile
        tokens, targets = batches[-1]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision != "fp32"):
                loss = F.cross_entropy(forward(tokens).float().view(-1, cfg["vocab"]), targets.view(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
            opt.step()
            torch.cuda.synchronize()
        def table(averages, sort, **kwargs):  # (PyTorch 2.4 renamed cuda_* to device_*)
            try:
                return averages.table(sort_by=sort.replace("cuda", "device"), **kwargs)
            except (AttributeError, KeyError, ValueError):
                return averages.table(sort_by=sort, **kwargs)
        with open(args.profile, "w") as f:
            f.write(table(prof.key_averages(group_by_input_shape=True), "cuda_time_total", row_limit=80,
                          max_name_column_width=60, max_shapes_column_width=80))
            f.write(table(prof.key_averages(), "self_cuda_time_total", row_limit=60, max_name_column_width=90))
    tokens_per_step = cfg["batch"] * cfg["seq_len"]
    median = statistics.median(times)
    what = f" ({len(fp8)} FP8 linear layers, delayed scaling)" if args.precision == "fp8" else ""
    if args.precision == "torchao":
        what = f" (torchao float8, {len(model.lin)} Float8Linear layers, tensorwise dynamic scaling)"
    mode = "torch.compile" if args.compile else "eager"
    if args.checkpoint_activations:
        mode += " with activation checkpointing"
    if args.ddp:
        mode += f" + DDP on {ranks} GPUs"
        if rank != 0:
            return
    if args.losses:
        with open(args.losses, "w") as f:
            json.dump({"model": cfg.get("name", ""), "precision": args.precision, "mode": mode, "steps": total,
                       "torch": torch.__version__, "losses": losses}, f, indent=1)
    print(f"pytorch {args.precision:<5} {mode}{what}, {torch.cuda.get_device_name()}: median {median:.2f} ms, "
          f"mean {statistics.mean(times):.2f} ms, {tokens_per_step / median * 1000:.0f} tokens/s, "
          f"peak memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB, final loss {loss.item():.4f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help='a tgc checkpoint; "random" with --bench and --config: weights drawn here')
    parser.add_argument("--config", help="model file whose training settings to use")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default="losses.json")
    parser.add_argument("--generate", help="prompt token ids: print greedy continuations instead")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--bench", action="store_true", help="time training on the GPU instead")
    parser.add_argument("--compile", action="store_true", help="with --bench: torch.compile the model")
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp8", "torchao"], default="fp32",
                        help="torchao: torchao's float8 training under BF16 autocast (torchao on PYTHONPATH)")
    parser.add_argument("--fp8-min-dim", type=int, help="as tgc's fp8_min_dim (default: the model file's)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, help="the (global) batch (default: the model file's)")
    parser.add_argument("--profile", help="with --bench: write PyTorch's profile of one more step here")
    parser.add_argument("--device", default="cpu", help="where the losses are computed (cpu, cuda)")
    parser.add_argument("--losses", help="with --bench: write every step's loss (warm-up steps too) as JSON here")
    parser.add_argument("--checkpoint-activations", action="store_true",
                        help="with --bench: each block's activations made again in the backward")
    parser.add_argument("--ddp", action="store_true",
                        help="with --bench, under torchrun: DistributedDataParallel, the batch split over the ranks")
    args = parser.parse_args()
    torch.manual_seed(0)
    if not args.bench:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # (deterministic cuBLAS)
        torch.use_deterministic_algorithms(True)
        torch.set_num_threads(1)
    if args.bench:
        bench(args)
    elif args.generate:
        generate(args)
    else:
        train(args)


if __name__ == "__main__":
    main()
