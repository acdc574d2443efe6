# The two commands of the README. Each sets up what it needs on a fresh machine.
#   make train [ARGS="optimizer=lars global_batch_size=512"]   # the main job
#   make test                                                   # the whole test suite
.PHONY: train test env

train:
	@scripts/setup_env.sh main
	.venv/bin/largebatch-train $(ARGS)

test:
	@scripts/test.sh

env:
	@scripts/setup_env.sh main
