"""Lab: suffix with planning off (every candidate node drafted), for an oracle bound."""
import sys
from specdecode.drafters import suffix as S
S.SuffixDrafter._may_pay = lambda self, m, stored, cap, rows: True
S.SuffixDrafter.plan = lambda self, tree, rows=1: (len(tree.tokens), 1.0)
if len(sys.argv) > 1 and sys.argv[1] == "--cap15":
    sys.argv.pop(1)
    orig = S.SuffixDrafter.__init__
    def init(self, *a, **k):
        orig(self, *a, **k); self.spec_factor = 100.0
    S.SuffixDrafter.__init__ = init
from specdecode.cli import main
sys.exit(main(sys.argv[1:]))
