# The two commands of the README. Each sets up what it needs on a fresh machine.
#   make train [ARGS="optimizer=lars global_batch_size=512"]   # the main job
#   make test                                                   # the whole test suite
#   make docs                                                   # the documentation site, served locally
.PHONY: train test env docs

train:
	@scripts/setup_env.sh main
	.venv/bin/largebatch-train $(ARGS)

test:
	@scripts/test.sh

env:
	@scripts/setup_env.sh main

docs:
	@scripts/setup_env.sh docs
	NO_MKDOCS_2_WARNING=1 .venv-docs/bin/mkdocs serve
