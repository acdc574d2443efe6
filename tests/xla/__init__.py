"""XLA tests: run in .venv-xla with PJRT_DEVICE=CPU (scripts/test_xla.sh); skipped elsewhere."""
