"""Writes a Triton model repository for one model from the template in `model_repository/`."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from replica.backend.model_parameters import ModelParameters

TEMPLATE_DIR = Path(__file__).parent / "model_repository" / "smollm2"
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def write_model_repository(dest: Path, model_name: str, parameters: ModelParameters, template_dir: Path = TEMPLATE_DIR) -> Path:
    """Create `dest/<model_name>/{config.pbtxt,1/model.py}`; returns `dest`."""
    if not _MODEL_NAME.match(model_name):
        raise ValueError(f"model name {model_name!r} must match {_MODEL_NAME.pattern}")
    model_dir = dest / model_name
    if model_dir.exists():
        shutil.rmtree(model_dir)
    (model_dir / "1").mkdir(parents=True)
    shutil.copy2(template_dir / "1" / "model.py", model_dir / "1" / "model.py")
    config = (template_dir / "config.pbtxt").read_text(encoding="utf-8")
    config, count = re.subn(r'^name:\s*"[^"]*"', f'name: "{model_name}"', config, count=1, flags=re.M)
    if count != 1:
        raise ValueError("config.pbtxt template has no top-level name")
    (model_dir / "config.pbtxt").write_text(parameters.render_into(config), encoding="utf-8")
    return dest
