import time, torch
from specdecode.verify import rejection_sample_tree
from specdecode.verify_tree_batch import TreeRow, verify_trees
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
V = 49152
for name, parents in [("3x2 (9 nodes)", [-1, -1, -1, 0, 0, 1, 1, 2, 2]), ("chain-ish 4+4", [-1, 0, 1, 2, -1, 4, 5, 6])]:
    n = len(parents)
    for det in (True, False):
        p = torch.softmax(torch.randn(n + 1, V, generator=g) * 3, -1)
        q = None if det else torch.softmax(torch.randn(n, V, generator=g) * 3, -1)
        tokens = [int(torch.argmax(p[par + 1])) if k % 2 == 0 else int(torch.randint(0, V, (1,), generator=g)) for k, par in enumerate(parents)]
        for f, label in ((lambda s: rejection_sample_tree(p, tokens, parents, q, torch.Generator().manual_seed(s)), "reference"),
                         (lambda s: verify_trees([TreeRow(p, tokens, parents, q, torch.Generator().manual_seed(s))]), "batched")):
            for s in range(5): f(s)
            t0 = time.perf_counter(); R = 50
            for s in range(R): f(s)
            print(f"{name} {'deterministic' if det else 'sampled'} {label}: {(time.perf_counter()-t0)/R*1e3:.2f} ms")
