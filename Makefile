# The two commands of the README: `make demo` and `make test`.
VENV_BIN := $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV)/bin,.venv/bin)
PY := $(VENV_BIN)/python

.PHONY: setup demo test samples lab

setup:
	@bash scripts/setup.sh

# Main job: compare the bundled control and candidate captures, A/A repeat as the noise floor.
# `workbench compare` exits 1 when it finds a divergence, which is the expected outcome here.
demo: setup
	@$(VENV_BIN)/workbench compare captures/control captures/candidate --aa captures/control-repeat; \
	  rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 1 ]

test: setup
	$(PY) -m pytest -q

samples: setup
	$(VENV_BIN)/workbench samples --out captures

lab: setup
	$(VENV_BIN)/jupyter lab notebooks/
