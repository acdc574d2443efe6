#!/usr/bin/env bash
# Create (or update) the project's virtual environment(s). Idempotent: a stamp records what
# was installed, so a second run returns in a second.
#
#   scripts/setup_env.sh          # .venv: torch 2.14.1, the package with [dev,dali,docs]
#   scripts/setup_env.sh xla      # .venv-xla: torch 2.9.0 + torch-xla 2.9.0 (XLA:CPU tests)
#   scripts/setup_env.sh docs     # .venv-docs: the site's tools only (~195 MB, no torch): make docs
#
# Reads: PYTHON (default python3), VENV (default .venv), VENV_XLA (default .venv-xla), VENV_DOCS
#        (default .venv-docs),
#        NEED_GIB (free space a fresh venv needs; default 8 for .venv, 11 for .venv-xla),
#        HEADROOM_GIB (free space to leave beside it for other work, default 0: scripts/test.sh sets
#        up .venv-xla while the main suite writes its files).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
what=${1:-main}

# Disk a fresh set-up takes at its peak, measured on Linux x86-64 (torch's PyPI wheels bring their
# CUDA libraries; pip unpacks each wheel beside what it installs): .venv 7.0 GiB (7.0 GiB when
# done), .venv-xla 10.5 GiB (7.7 GiB when done). A fresh set-up refuses to start with less free
# space than that (pip would fail minutes later, half-installed, on ENOSPC); exit 74 as for the
# run's writes.
need_gib() { case $1 in main) echo 8 ;; xla) echo 11 ;; esac; }

check_space() {  # check_space DIR CONSTRAINTS
  local dir=$1 need free_kib at
  [[ -x $dir/bin/python ]] && return 0  # an update of an existing venv needs far less
  need=$((${NEED_GIB:-$(need_gib "$2")} + ${HEADROOM_GIB:-0}))
  at=$(realpath -m "$dir")
  until [[ -d $at ]]; do at=$(dirname "$at"); done
  free_kib=$(df -Pk "$at" | awk 'NR == 2 {print $4}')
  if ((free_kib < need * 1024 * 1024)); then
    echo "setup_env: $((free_kib / 1024 / 1024)) GiB free where $dir goes; it needs about $need GiB (torch with its CUDA libraries${HEADROOM_GIB:+, and $HEADROOM_GIB GiB left for other work}): free some space and run again" >&2
    exit 74
  fi
}

stamp_of() { cat setup.py constraints/"$1".txt | sha256sum | cut -c1-16; }

make_env() {  # make_env DIR CONSTRAINTS EXTRAS
  local dir=$1 cons=$2 extras=$3 want
  want=$(stamp_of "$cons")
  if [[ -f $dir/.stamp && $(cat "$dir/.stamp") == "$want" ]]; then
    return 0
  fi
  check_space "$dir" "$cons"
  echo "setting up $dir (constraints/$cons.txt, extras [$extras]) ..." >&2
  [[ -x $dir/bin/python ]] || "$PYTHON" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --upgrade pip setuptools wheel
  # torch first, pinned, so nothing later pulls a different build.
  "$dir/bin/python" -m pip install -q -c "constraints/$cons.txt" torch torchvision
  "$dir/bin/python" -m pip install -q -c "constraints/$cons.txt" -e ".[$extras]"
  echo "$want" > "$dir/.stamp"
}

# The documentation site needs no torch: mkdocstrings reads the package's source (griffe, static),
# and the site's hooks import only the config schema (hydra-core, omegaconf). The docs extra and
# those two, then the package itself without its dependencies: a minute, not the 6.5 GiB .venv.
make_docs_env() {  # make_docs_env DIR
  local dir=$1 want
  want=$(stamp_of main)
  if [[ -f $dir/.stamp && $(cat "$dir/.stamp") == "$want" ]]; then
    return 0
  fi
  echo "setting up $dir (the docs extra, hydra-core and omegaconf; no torch) ..." >&2
  [[ -x $dir/bin/python ]] || "$PYTHON" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --upgrade pip setuptools wheel
  local docs
  docs=$("$PYTHON" -c 'import ast, sys
tree = ast.parse(open("setup.py").read())
extras = next(k.value for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords if k.arg == "extras_require")
print(" ".join(ast.literal_eval(extras)["docs"]))')
  # shellcheck disable=SC2086  # the requirement strings hold no spaces
  "$dir/bin/python" -m pip install -q -c constraints/main.txt $docs hydra-core omegaconf
  "$dir/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
  echo "$want" > "$dir/.stamp"
}

case $what in
  main) make_env "${VENV:-.venv}" main "dev,dali,docs" ;;
  xla) make_env "${VENV_XLA:-.venv-xla}" xla "dev,xla" ;;
  docs) make_docs_env "${VENV_DOCS:-.venv-docs}" ;;
  *) echo "usage: $0 [main|xla|docs]" >&2; exit 2 ;;
esac
