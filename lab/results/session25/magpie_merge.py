import sys, json
sys.path.insert(0, '/work/main/src')
from pathlib import Path
from specdecode.drafters.suffix_store import read_store, save_store
old, rec_old = read_store(Path('/work/main/models/smollm2-135m-instruct/drafters/suffix'))
new, rec_new = read_store(Path(sys.argv[1]))
print(len(old), sum(map(len, old)), len(new), sum(map(len, new)))
recipe = {"merged": [rec_old, rec_new]}
print(save_store(Path(sys.argv[2]), old + new, 49152, recipe))
