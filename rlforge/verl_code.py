"""What loading a verl project's own code (tool classes, function tools, dataset classes) through verl's loaders
needs: verl importable, and the working directory searched as under verl's ``python -m`` launch."""

from __future__ import annotations

import os
import sys

# verl 0.9.1 declares dependencies older than rlforge's (transformers < 5.11); what its loaders import needs these only
INSTALL = "pip install --no-deps verl==0.9.1 tensordict==0.10.0 pyvers==0.1.0 codetiming==1.4.0"


def search_working_directory() -> None:
    """Make the working directory's modules importable (after the rest of ``sys.path``), as they are under verl's
    ``python -m verl.trainer.main_ppo``: a tool's ``class_name`` module or a recipe's ``from recipe.x import ...``."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
