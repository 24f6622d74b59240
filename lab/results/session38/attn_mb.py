"""Attention op alone, 24 layers of caches (1.7B shape unless SHAPE), fp16: ms per pass of t tokens at ctx keys."""
import os, sys, time, torch
torch.set_num_threads(1)
from specdecode.kernels.fused import load_fused_extension
from specdecode.models.config import ModelConfig
from specdecode.models.llama import rope_tables
ext = load_fused_extension()
shape = os.environ.get("SHAPE", "1.7b")
H, KV, D, L = {"1.7b": (32, 32, 64, 24), "360m": (15, 5, 64, 32), "135m": (9, 3, 64, 30)}[shape]
cfg = ModelConfig(architecture="LlamaForCausalLM", family="llama", vocab_size=10, dim=H * D, n_layers=1, n_heads=H,
                  n_kv_heads=KV, head_dim=D, intermediate_size=8, max_position_embeddings=8192, norm_eps=1e-5,
                  tie_embeddings=True)
cos, sin = rope_tables(cfg, 8192)
g = torch.Generator().manual_seed(0)
out = []
for ctx in [int(c) for c in os.environ.get("CTXS", "512,2048").split(",")]:
    caches = [(torch.randn(1, KV, ctx + 16, D, generator=g).half(), torch.randn(1, KV, ctx + 16, D, generator=g).half())
              for _ in range(int(os.environ.get("NL", L)))] * (L // int(os.environ.get("NL", L)))
    for t in [int(x) for x in os.environ.get("TS", "1,5,9").split(",")]:
        qkv = torch.randn(1, t, (H + 2 * KV) * D, generator=g)
        def one():
            for kc, vc in caches:
                ext.attention(qkv, cos, sin, kc, vc, 0, [ctx], H, KV, D, D ** -0.5)
        for _ in range(3): one()
        ts = []
        t0 = time.time()
        while time.time() - t0 < float(sys.argv[1]) if len(sys.argv) > 1 else 2.0:
            a = time.perf_counter(); one(); ts.append(time.perf_counter() - a)
        ts.sort()
        out.append(f"ctx {ctx} t {t}: {ts[len(ts)//2]*1e3:.2f}")
print(shape, " | ".join(out))
