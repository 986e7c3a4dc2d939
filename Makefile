# The two commands of the README. Both set up .venv first (idempotent, quick when already done).
.PHONY: chat test lint

chat:
	scripts/setup.sh
	.venv/bin/parley

test:
	scripts/setup.sh test
	.venv/bin/ruff check .
	.venv/bin/python -m pytest -q -n auto --maxprocesses 4 --dist loadfile

lint:
	.venv/bin/ruff check .
