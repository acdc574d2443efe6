#!/usr/bin/env bash
# Create (or update) the project's virtual environment(s). Idempotent: a stamp records what
# was installed, so a second run returns in a second.
#
#   scripts/setup_env.sh          # .venv: torch 2.14.1, the package with [dev,dali]
#   scripts/setup_env.sh xla      # .venv-xla: torch 2.9.0 + torch-xla 2.9.0 (XLA:CPU tests)
#
# Reads: PYTHON (default python3), VENV (default .venv), VENV_XLA (default .venv-xla).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
what=${1:-main}

stamp_of() { cat setup.py constraints/"$1".txt | sha256sum | cut -c1-16; }

make_env() {  # make_env DIR CONSTRAINTS EXTRAS
  local dir=$1 cons=$2 extras=$3 want
  want=$(stamp_of "$cons")
  if [[ -f $dir/.stamp && $(cat "$dir/.stamp") == "$want" ]]; then
    return 0
  fi
  echo "setting up $dir (constraints/$cons.txt, extras [$extras]) ..." >&2
  [[ -x $dir/bin/python ]] || "$PYTHON" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --upgrade pip setuptools wheel
  # torch first, pinned, so nothing later pulls a different build.
  "$dir/bin/python" -m pip install -q -c "constraints/$cons.txt" torch torchvision
  "$dir/bin/python" -m pip install -q -c "constraints/$cons.txt" -e ".[$extras]"
  echo "$want" > "$dir/.stamp"
}

case $what in
  main) make_env "${VENV:-.venv}" main "dev,dali" ;;
  xla) make_env "${VENV_XLA:-.venv-xla}" xla "dev,xla" ;;
  *) echo "usage: $0 [main|xla]" >&2; exit 2 ;;
esac
