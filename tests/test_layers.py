"""The package's layering (pyproject.toml, [tool.importlinter]): core <- training | eval | cost (siblings) <- export <-
repro, the core free of table, plot and evaluation libraries, optim free of distributed; every module of the package in
one layer; and the tests of a layer importing only that layer and the layers below it."""

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import lowcomm

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).parent / "lint-imports"


def contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def layers() -> list[set[str]]:
    """The layers contract's layers, top first; "a | b" are siblings in one layer."""
    (contract,) = [c for c in contracts() if c["type"] == "layers"]
    return [{module.strip() for module in layer.split("|")} for layer in contract["layers"]]


def core() -> set[str]:
    """The core: the source modules of the contract that forbids them training."""
    return {m for c in contracts() if c["type"] == "forbidden" and "lowcomm.training" in c["forbidden_modules"]
            for m in c["source_modules"]}


def importable_by_tests_of(folder: str) -> set[str]:
    """What tests/<folder>/ may import: the core, and for a layer's folder that layer and the layers below it."""
    if folder == "core":
        return core() | {"lowcomm.cost"}
    stack = layers()
    module = f"lowcomm.{folder}"
    level = next((i for i, layer in enumerate(stack) if module in layer), None)
    assert level is not None, f"tests/{folder}/ is named after no layer of pyproject's contracts"
    return core() | {module} | set().union(*stack[level + 1:])


def lowcomm_imports(path: Path) -> list[tuple[int, str]]:
    """(line, lowcomm.<name>) for every import of a lowcomm module in a file, inside functions too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"lowcomm.{alias.name}" for alias in node.names] if node.module == "lowcomm" else [node.module]
        else:
            continue
        found += [(node.lineno, ".".join(n.split(".")[:2])) for n in names if n.startswith("lowcomm.")]
    return found


def test_import_contracts_are_kept():
    done = subprocess.run([str(LINT)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(contracts())} kept, 0 broken" in done.stdout


def test_every_module_of_the_package_lies_in_a_layer_or_the_core():
    placed = core().union(*layers())
    package = Path(lowcomm.__file__).parent
    modules = {f"lowcomm.{p.stem}" for p in package.iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert modules == placed, f"place {sorted(modules - placed)} in pyproject's contracts"


def test_tests_import_only_their_own_layer_and_below():
    """tests/<layer>/ imports its layer, the layers below it and the core, never a sibling or a layer above;
    tests/core/ imports the core and lowcomm.cost only (the model its measured bytes and state are checked against);
    the helpers every folder imports (conftest.py, support.py) import the core only."""
    tests = ROOT / "tests"
    allowed = {path: core() for path in tests.glob("*.py") if not path.name.startswith("test_")}
    for folder in sorted(p for p in tests.iterdir() if p.is_dir() and any(p.rglob("*.py"))):
        allowed |= {path: importable_by_tests_of(folder.name) for path in folder.rglob("*.py")}
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {module}" for path, modules in allowed.items()
             for line, module in lowcomm_imports(path) if module not in modules]
    assert not wrong, "move each test to the folder of the highest layer it imports:\n" + "\n".join(wrong)
