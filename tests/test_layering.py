"""The layering contract (docs/architecture.md, "Layering"; .importlinter) holds: every import,
also inside a function, points down replica < tenants < models_registry < billing < inference <
fleet | rollouts < consoles | dashboard. `.ci/run` runs the same `lint-imports` before the
suite; this test makes a plain test run see it too."""
from __future__ import annotations

import configparser
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _layers() -> list[list[str]]:
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    raw = config["importlinter:contract:layers"]["layers"]
    return [[name.strip() for name in line.split("|")] for line in raw.strip().splitlines()]


def test_import_linter_contract_is_kept():
    done = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "1 kept, 0 broken" in done.stdout


def test_contract_names_every_app_in_the_documented_order():
    assert _layers() == [["consoles", "dashboard"], ["fleet", "rollouts"], ["inference"],
                         ["billing"], ["models_registry"], ["tenants"], ["replica", "common"]]
    ours = {"tenants", "models_registry", "billing", "inference", "fleet", "rollouts",
            "dashboard", "consoles"}
    installed = [app for app in settings.INSTALLED_APPS if app in ours]
    # INSTALLED_APPS lists them lowest first, so each app's admin/ready() runs after those it
    # builds on (billing's admin extends the catalogue's version page).
    assert installed == ["tenants", "models_registry", "billing", "inference", "fleet",
                         "rollouts", "dashboard", "consoles"]


def test_an_upward_import_breaks_the_contract(tmp_path):
    """The check is not vacuous: the tree with the lowest layer (`replica`) replaced by a
    package that imports `tenants` inside a function fails it."""
    for name in ("common", "replica", "tenants", "models_registry", "billing", "inference", "fleet",
                 "rollouts", "consoles", "dashboard"):
        (tmp_path / name).symlink_to(REPO / name)
    (tmp_path / ".importlinter").write_text((REPO / ".importlinter").read_text())
    (tmp_path / "replica").unlink()
    copy = tmp_path / "replica"
    copy.mkdir()
    (copy / "__init__.py").write_text("def late():\n    import tenants.models  # noqa\n")
    done = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode != 0
    assert "replica -> tenants" in done.stdout or "replica.__init__" in done.stdout, done.stdout


@pytest.mark.django_db
def test_migrations_match_the_models():
    """The moves between apps left no model out of step with its migrations (the test
    database itself was built by running them from zero)."""
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()
