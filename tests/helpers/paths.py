"""Where things are: the repository, and the demo dataset the package ships."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEMO_DATA = Path(str(resources.files("finetune_studio.demo") / "tiny_alpaca.jsonl"))
