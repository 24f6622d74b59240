"""1.7B-shape Q4_K_M (random weights, /work/ladder): ms of a target pass over 1..9 tokens after 200 of context
(median of 7), 1 thread, for whichever build PYTHONPATH points at."""
import torch
torch.set_num_threads(1)
import specdecode
from specdecode.sizing.costs import measure_costs
t = specdecode.load_model("/work/ladder/1.7b-Q4_K_M.gguf")
c = measure_costs(t, None, max_gamma=8, reps=7)
print("ms:", " ".join(f"{x * 1e3:.1f}" for x in c.target_s), "| v:", " ".join(f"{x:.2f}" for x in c.v))
