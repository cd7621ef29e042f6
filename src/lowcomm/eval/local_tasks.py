"""`python -m lowcomm.eval.local_tasks DATA_DIR --out TASK_DIR`: the paper's lm-eval tasks on local copies of their
data.

Each YAML written `include:`s lm-eval's installed task file, so the task keeps its own prompt template, choice
list, target, document preprocessing (HellaSwag's `process_docs`) and metrics; it only points `dataset_path: json`
at the local files. The task is named `<task>_local`, so every score says which data it came from. Then
`python -m lowcomm.eval.evaluate RUN --tasks arc_easy_local,hellaswag_local --include-path TASK_DIR`.

DATA_DIR holds one folder per task, one JSON-lines file per split, rows in the dataset's own schema:
  arc_easy/test.jsonl, arc_challenge/test.jsonl    question, choices {text, label}, answerKey
  hellaswag/validation.jsonl                        ctx_a, ctx_b, activity_label, endings, label
  piqa/validation.jsonl                             goal, sol1, sol2, label
  mmlu_<subject>/test.jsonl (dev.jsonl optional)    question, subject, choices, answer
With one or more MMLU subjects, the group `mmlu_local` averages them (weighted by size, as lm-eval's `mmlu`).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

LOCAL_SUFFIX = "_local"
MMLU_GROUP = "mmlu" + LOCAL_SUFFIX


@dataclass(frozen=True)
class Source:
    """Where lm-eval defines a task (relative to lm_eval/tasks/), the split it scores and the fields it reads."""

    definition: str
    split: str
    fields: tuple[str, ...]


ARC_FIELDS = ("question", "choices", "answerKey")
MMLU_FIELDS = ("question", "subject", "choices", "answer")
SOURCES = {
    "arc_easy": Source("arc/arc_easy.yaml", "test", ARC_FIELDS),
    "arc_challenge": Source("arc/arc_challenge.yaml", "test", ARC_FIELDS),
    "hellaswag": Source("hellaswag/hellaswag.yaml", "validation", ("ctx_a", "ctx_b", "activity_label", "endings",
                                                                   "label")),
    "piqa": Source("piqa/piqa.yaml", "validation", ("goal", "sol1", "sol2", "label")),
}


class LocalDataError(ValueError):
    """Local files that cannot stand for a task's dataset; the message names the file and the fix."""


def lm_eval_tasks_dir() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent


def source_of(task: str) -> Source | None:
    """The task's Source: a paper task, or `mmlu_<subject>` where lm-eval defines that subject."""
    if task in SOURCES:
        return SOURCES[task]
    if task.startswith("mmlu_") and (lm_eval_tasks_dir() / "mmlu" / "default" / f"{task}.yaml").exists():
        return Source(f"mmlu/default/{task}.yaml", "test", MMLU_FIELDS)
    return None


def check_rows(path: Path, fields: tuple[str, ...]) -> None:
    """Every line of `path` a JSON object holding `fields`; else a LocalDataError naming the line."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise LocalDataError(f"{path}:{number}: not a JSON object: write one item per line") from None
        missing = [f for f in fields if f not in row]
        if missing:
            raise LocalDataError(f"{path}:{number}: no field(s) {missing}; the task reads {list(fields)}")


def task_yaml(task: str, source: Source, folder: Path) -> dict:
    """The including YAML of one task: lm-eval's definition, the local files, the splits they hold."""
    files = {split.stem: str(split.resolve()) for split in sorted(folder.glob("*.jsonl"))}
    config = {"include": str(lm_eval_tasks_dir() / source.definition), "task": task + LOCAL_SUFFIX, "tag": [],
              "dataset_path": "json", "dataset_name": None, "dataset_kwargs": {"data_files": files},
              "training_split": files.get("train") and "train", "validation_split": None, "test_split": None,
              "fewshot_split": files.get("dev") and "dev"}
    config["validation_split" if source.split == "validation" else "test_split"] = source.split
    return config


def write_task_yamls(data_dir: Path, out_dir: Path) -> list[str]:
    """An including YAML per task folder of `data_dir` (and the MMLU group) in `out_dir`; the task names written."""
    folders = sorted(p for p in Path(data_dir).iterdir() if p.is_dir()) if Path(data_dir).is_dir() else []
    configs = {}
    for folder in folders:
        source = source_of(folder.name)
        if source is None:
            raise LocalDataError(f"{folder}: not a paper task's folder: name it one of {sorted(SOURCES)} or "
                                 "mmlu_<subject>")
        split = folder / f"{source.split}.jsonl"
        if not split.exists():
            raise LocalDataError(f"{folder}: no {split.name}: {folder.name} is scored on its {source.split} split")
        for path in sorted(folder.glob("*.jsonl")):
            check_rows(path, source.fields)
        configs[folder.name + LOCAL_SUFFIX] = task_yaml(folder.name, source, folder)
    if not configs:
        raise LocalDataError(f"{data_dir}: no task folders (arc_easy/, hellaswag/, piqa/, mmlu_<subject>/, ...)")
    subjects = sorted(name for name in configs if name.startswith("mmlu_"))
    if subjects:
        configs[MMLU_GROUP] = {"group": MMLU_GROUP, "task": subjects, "aggregate_metric_list": [
            {"metric": "acc", "aggregation": "mean", "weight_by_size": True}], "metadata": {"version": 1.0}}
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, config in configs.items():
        (out_dir / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return list(configs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lowcomm.eval.local_tasks", description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path, help="one folder per task, one <split>.jsonl per split")
    parser.add_argument("--out", type=Path, required=True, help="where to write the task YAMLs (--include-path)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        names = write_task_yamls(args.data_dir, args.out)
    except LocalDataError as err:
        sys.exit(f"error: {err}")
    print(f"wrote {len(names)} task(s) to {args.out}: {', '.join(names)}")
    print(f"evaluate with: python -m lowcomm.eval.evaluate RUN --tasks {','.join(names)} --include-path {args.out}")


if __name__ == "__main__":
    main()
