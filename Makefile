# Research compendium: the two commands are `make reproduce` and `make test`.
# Both bootstrap the project virtual environment (.venv) from pyproject.toml and
# requirements.lock when it is missing or older than those files.
#
#   make reproduce                  every stage, embedded profile (MemeWorld + tiny models, CPU)
#   make reproduce PROFILE=paper    the same notebooks with params/paper.yaml
#   make reproduce NB=03            one stage (by number prefix or stem)
#   make test                       pytest + nbval over the notebooks (embedded profile)

PROFILE ?= embedded
NB ?=
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stamp

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export PYTHONHASHSEED := 0
export MPLBACKEND := Agg

.PHONY: reproduce test test-unit test-notebooks test-gpu data venv lock environment.yml check-params results clean-artifacts help

help:
	@sed -n '1,12p' Makefile

$(STAMP): pyproject.toml requirements.lock
	@echo ">> bootstrapping $(VENV) (python: $$($(PYTHON) --version))"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements.lock -e .
	@touch $(STAMP)

venv: $(STAMP)

reproduce: $(STAMP)
	$(PY) -m lib.runner reproduce --profile $(PROFILE) $(if $(NB),--only $(NB),)

data: $(STAMP)
	$(PY) -m lib.runner reproduce --profile $(PROFILE) --only 00

check-params: $(STAMP)
	$(PY) -m lib.params --profile $(PROFILE)

results: $(STAMP)
	$(PY) -m lib.results --readme README.md

test: $(STAMP)
	$(PY) -m lib.runner test

test-unit: $(STAMP)
	$(PY) -m pytest -q tests -m "not artifacts and not gpu"

test-notebooks: $(STAMP)
	$(PY) -m lib.runner test --skip-unit

test-gpu: $(STAMP)
	$(PY) -m pytest -q tests -m gpu

# Regenerate the resolved-version lock from the current environment.
lock: $(STAMP)
	$(PY) -m pip freeze --exclude-editable | grep -v '^-e ' > requirements.lock

environment.yml: pyproject.toml
	$(PY) -m lib.envfiles > environment.yml

clean-artifacts:
	rm -rf artifacts/$(PROFILE)
