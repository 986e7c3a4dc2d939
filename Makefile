# The two commands of the README. Both set up .venv first (idempotent, quick when already done).
.PHONY: chat test lint

chat:
	scripts/setup.sh
	.venv/bin/parley

# Test workers: one more than the cores, up to 4. Many tests wait on a subprocess, a server or a browser, and a
# spare worker keeps the cores busy meanwhile; beside another load the workers also hold a fairer share.
WORKERS := $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n + 1 > 4 ? 4 : n + 1 )))

test:
	scripts/setup.sh test
	.venv/bin/ruff check .
	.venv/bin/python -m pytest -q -n $(WORKERS) --dist loadfile

lint:
	.venv/bin/ruff check .
