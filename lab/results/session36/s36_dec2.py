import sys, time, torch, os
from specdecode.models import load_model
from specdecode.engine import generate
torch.set_num_threads(int(os.environ.get("T", "1")))
t = load_model(sys.argv[1])
generate(t, "def fib(n):", max_new_tokens=8, ignore_eos=True)
open("/tmp/ready","w").write(str(os.getpid()))
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    generate(t, "def fib(n):", max_new_tokens=256, ignore_eos=True)
    dt = time.perf_counter() - t0
    print(f"{256/dt:.1f} tok/s {dt/256*1e3:.2f} ms/step", flush=True)
