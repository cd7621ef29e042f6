"""The package as a wheel: it holds every method preset and lm-eval task file of the source tree, and, imported from
the wheel's files outside any checkout, it reads them through importlib.resources and records no git commit."""

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from lowcomm.config import method_preset
from lowcomm.eval.tasks import OFFLINE_TASK, TASKS_DIR
from lowcomm.paths import METHODS_DIR, method_names

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "lowcomm"
DATA_DIRS = ("methods", "eval/task_files")
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
FROM_THE_WHEEL = f"""
import json, lowcomm
from lowcomm.config import method_preset
from lowcomm.eval.tasks import TASKS_DIR
from lowcomm.training.run_dir import code_source
print(json.dumps({{"package": lowcomm.__file__, "lordo": method_preset("lordo").sync.name,
                  "task": (TASKS_DIR / "{OFFLINE_TASK}" / "{OFFLINE_TASK}.yaml").is_file(), **code_source()}}))
"""


def package_data() -> set[str]:
    """The files of the source tree's DATA_DIRS, named as in a wheel (lowcomm/...)."""
    return {p.relative_to(PACKAGE.parent).as_posix() for d in DATA_DIRS for p in (PACKAGE / d).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of pyproject.toml and src/lowcomm (so the build writes nothing into the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    shutil.copytree(PACKAGE, tmp / "src" / "lowcomm", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "--wheel-dir", str(tmp / "dist"), str(tmp)], check=True, capture_output=True)
    (built,) = (tmp / "dist").glob("lowcomm-*.whl")
    return built


def test_the_wheel_holds_every_method_preset_and_task_file(wheel):
    shipped = package_data()
    assert {"lowcomm/methods/lordo.yaml", f"lowcomm/eval/task_files/{OFFLINE_TASK}/{OFFLINE_TASK}.jsonl"} <= shipped
    assert shipped - set(zipfile.ZipFile(wheel).namelist()) == set()


def test_presets_and_tasks_resolve_through_importlib_resources():
    assert method_names() == sorted(p.stem for p in (PACKAGE / "methods").glob("*.yaml"))
    assert (METHODS_DIR, TASKS_DIR) == (PACKAGE / "methods", PACKAGE / "eval" / "task_files")
    assert method_preset("lordo").sync.name == "lordo"


def test_the_wheel_imported_outside_a_checkout_reads_its_data_and_records_no_commit(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # a pure-Python wheel's files, as pip lays them out in site-packages
    done = subprocess.run([sys.executable, "-c", FROM_THE_WHEEL], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(site)}, check=True)
    source = json.loads(done.stdout.splitlines()[-1])
    assert source["package"] == str(site / "lowcomm" / "__init__.py")
    assert (source["lordo"], source["task"]) == ("lordo", True)
    assert (source["lowcomm_version"], source["lowcomm_location"]) == (VERSION, str(site / "lowcomm"))
    assert (source["git_commit"], source["git_changes"]) == ("not-a-checkout", [])
