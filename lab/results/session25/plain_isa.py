import time, torch, specdecode
from specdecode.kernels import quant as Q
torch.set_num_threads(1)
t = specdecode.load_model("/tmp/plain/smol.gguf", weight_dtype="int4")
from specdecode.chat import ChatFormatter
fmt = ChatFormatter.for_model(t)
prompt = fmt.render([{"role": "user", "content": "Explain why the sky is blue in a few paragraphs."}])
for rnd in range(3):
    for isa in ("avxvnni", "vnni512", "avx2"):
        Q.set_quant_isa(isa)
        r = specdecode.generate(t, prompt, max_new_tokens=200, ignore_eos=True)
        st = r.stats
        print(rnd, isa, f"{200/ (st.wall_s if hasattr(st,'wall_s') else 1):.1f}", {k: round(v,3) for k,v in vars(st).items() if isinstance(v,(int,float)) and k.endswith('_s')}, flush=True)
