"""The package's layering (pyproject.toml, [tool.importlinter]): core <- training | eval (siblings) <- export <- repro,
the core free of table, plot and evaluation libraries, optim free of distributed; and every module of the package in one
layer."""

import subprocess
import sys
import tomllib
from pathlib import Path

import lowcomm

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).parent / "lint-imports"


def contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_import_contracts_are_kept():
    done = subprocess.run([str(LINT)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(contracts())} kept, 0 broken" in done.stdout


def test_every_module_of_the_package_lies_in_a_layer_or_the_core():
    layers, core = set(), set()
    for contract in contracts():
        if contract["type"] == "layers":  # "a | b": independent siblings in one layer
            layers |= {module.strip() for layer in contract["layers"] for module in layer.split("|")}
        elif any(m.startswith("lowcomm.training") for m in contract["forbidden_modules"]):
            core |= set(contract["source_modules"])
    package = Path(lowcomm.__file__).parent
    modules = {f"lowcomm.{p.stem}" for p in package.iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert modules == layers | core, f"place {sorted(modules - layers - core)} in pyproject's contracts"
