"""An rlforge plugin module for ``long_tail_step.py``'s runs whose rollout runs in another process (a Ray rollout
worker): every process of the run loads it (``plugins.modules``), and it forces the response lengths there as
``long_tail_step.force_on_load`` does in the round's own process (``LONG_TAIL_ENDS``: the positions, comma-separated;
``LONG_TAIL_STOP``: the stop token id). No hooks."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from long_tail_step import force_on_load  # noqa: E402

if os.environ.get("LONG_TAIL_ENDS"):
    force_on_load(int(os.environ["LONG_TAIL_STOP"]), {int(p) for p in os.environ["LONG_TAIL_ENDS"].split(",")})
