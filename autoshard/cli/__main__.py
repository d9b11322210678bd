"""``python -m autoshard.cli``: the ``autoshard`` command without its console script
(as ``torchrun -m autoshard.cli calibrate-hardware ...`` runs it on every rank).

    python -m autoshard.cli solve examples.models.llama3:tiny --mesh 2x2 --dims dp,tp -o plan.json
"""

from __future__ import annotations

import sys

from autoshard.cli import main

if __name__ == "__main__":
    sys.exit(main())
