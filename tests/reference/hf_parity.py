#!/usr/bin/env python3
"""tgc against Hugging Face transformers: checkpoints both ways, logits and greedy tokens.

    python3 tests/reference/hf_parity.py TGC OUTDIR [--devices cpu,cuda]

For a randomly initialised GPT2LMHeadModel and a LlamaForCausalLM (grouped-query, Llama 3's
rope_scaling), each saved with save_pretrained:
  1. `tgc convert` makes a tgc checkpoint of it; tgc's logits of a prompt (`tgc generate
     --logits`, fp32) equal transformers' within 1e-4 relative (max |a - b| / max |b|), on
     each device, and its greedy tokens equal model.generate's;
  2. `tgc convert` writes it back as a Hugging Face folder, which from_pretrained loads with
     the same logits.
  3. a byte-level BPE trained by `tokenizers` (tokenizer.json) encodes a text to the same ids
     through `tgc tokenize`, and its ids decode to the same text.
Prints a table; exits 1 on any mismatch. Needs torch and transformers (the GPU machine).
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch
import transformers


def models():
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=1000, n_positions=128, n_embd=128, n_layer=2, n_head=4,
        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0))
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=1000, max_position_embeddings=128, hidden_size=128, intermediate_size=344,
        num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, rms_norm_eps=1e-5,
        rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}))
    # Weights of a trained model's spread, not init's near-zeros (which hide layout errors).
    for m in (gpt2, llama):
        with torch.no_grad():
            for p in m.parameters():
                p.normal_(0.0, 0.05 if p.dim() > 1 else 0.5)
        m.eval()
    return {"gpt2": gpt2, "llama": llama}


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout}{out.stderr}")
    return out.stdout


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def tokenizer_parity(tgc, out):
    """A byte-level BPE trained by `tokenizers` on this repository's documents, its tokenizer.json
    read by tgc: the same ids for a text of other scripts too, and the text back."""
    import glob
    import tokenizers
    docs = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "*.md")))
    corpus = os.path.join(out, "corpus.txt")
    with open(corpus, "w") as f:
        for d in docs:
            f.write(open(d).read())
    tok = tokenizers.ByteLevelBPETokenizer()
    tok.train([corpus], vocab_size=1000, min_frequency=2, special_tokens=["<|endoftext|>"])
    path = os.path.join(out, "tokenizer.json")
    tok.save(path)
    text = open(corpus).read() + "\nnaïve café — 東京 🙂 they're  I'LL\t\tdone<|endoftext|>\n\n"
    sample = os.path.join(out, "sample.txt")
    open(sample, "w").write(text)
    want = tok.encode(text).ids
    got = [int(t) for t in run([tgc, "tokenize", path, sample]).split()]
    ids = os.path.join(out, "ids.txt")
    open(ids, "w").write(" ".join(map(str, want)))
    back = run([tgc, "tokenize", path, ids, "--decode"])
    return path, got == want, back == text, len(want)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tgc")
    ap.add_argument("out")
    ap.add_argument("--devices", default="cpu,cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    prompt = [int(t) for t in torch.randint(0, 1000, (24,), generator=torch.Generator().manual_seed(1))]
    rows, failed = [], False
    for name, model in models().items():
        folder = os.path.join(args.out, name)
        model.save_pretrained(folder)
        ckpt = os.path.join(args.out, name + ".safetensors")
        run([args.tgc, "convert", folder, "-o", ckpt])
        with torch.no_grad():
            ids = torch.tensor([prompt])
            want = model(ids).logits[0].numpy()
            greedy = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                                    do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
        for device in args.devices.split(","):
            npy = os.path.join(args.out, f"{name}-{device}.npy")
            tokens = run([args.tgc, "generate", ckpt, "--device", device, "--precision", "fp32",
                          "--prompt", " ".join(map(str, prompt)), "--tokens", "8", "--logits", npy])
            got = np.load(npy)
            err = rel(got, want)
            same = [int(t) for t in tokens.split()] == greedy
            ok = err <= 1e-4 and same
            failed |= not ok
            rows.append((name, f"tgc {device}", err, same, ok))
        back = os.path.join(args.out, name + "-back")
        run([args.tgc, "convert", ckpt, "-o", back])
        cls = type(model)
        reloaded = cls.from_pretrained(back).eval()
        with torch.no_grad():
            err = rel(reloaded(ids).logits[0].numpy(), want)
        ok = err <= 1e-6
        failed |= not ok
        rows.append((name, "export -> from_pretrained", err, True, ok))
    path, same_ids, same_text, count = tokenizer_parity(args.tgc, args.out)
    failed |= not (same_ids and same_text)
    rows.append(("bpe", f"tokenize ({count} ids)", 0.0, same_ids and same_text, same_ids and same_text))
    print(f"{'model':<8}{'run':<28}{'max rel. err':>14}  greedy  ok")
    for name, what, err, same, ok in rows:
        print(f"{name:<8}{what:<28}{err:>14.3e}  {'same' if same else 'DIFF':<6}  {'yes' if ok else 'NO'}")
    json.dump([dict(model=r[0], run=r[1], rel_err=r[2], greedy_same=r[3], ok=r[4]) for r in rows],
              open(os.path.join(args.out, "hf-parity.json"), "w"), indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
