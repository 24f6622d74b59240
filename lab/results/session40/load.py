"""Intermittent load on one core: busy (a 2 MB-by-row matrix product, memory and arithmetic) and idle in turns of
0.2-2 s each, seeded, for as long as it runs."""
import random, time
import numpy as np
rng = random.Random(1)
a = np.random.rand(2048, 2048).astype(np.float32)
while True:
    end = time.time() + rng.uniform(0.2, 2.0)
    while time.time() < end:
        a @ a[:, :64]
    time.sleep(rng.uniform(0.2, 2.0))
