#!/usr/bin/env bash
# Build the container images: Dockerfile -> largebatch, Dockerfile.tpu -> largebatch-tpu. With
# docker (BuildKit) where its daemon answers, else with podman; the same files and tags either way.
#
#   scripts/build_image.sh                    # both images
#   scripts/build_image.sh gpu                # largebatch only (tpu: largebatch-tpu only)
#   scripts/build_image.sh gpu --no-cache     # further arguments go to every build
#   scripts/build_image.sh --dry-run          # print the commands only
#
# Reads:
#   CONTAINER_RUNTIME  docker | podman (default: docker if `docker info` answers, else podman)
#   BASE_IMAGE         the base both images start from (default: the Dockerfiles',
#                      python:3.11-slim-bookworm); e.g. one built from Debian's packages
#   LB_DRY_RUN=1       print the commands instead of running them (same as --dry-run)
set -euo pipefail

if [[ ${1:-} == --dry-run ]]; then
  LB_DRY_RUN=1
  shift
fi
which=all
case ${1:-} in
  gpu | tpu | all) which=$1; shift ;;
esac
cd "$(dirname "${BASH_SOURCE[0]}")/.."

runtime=${CONTAINER_RUNTIME:-}
if [[ -z $runtime ]]; then
  if command -v docker > /dev/null 2>&1 && docker info > /dev/null 2>&1; then
    runtime=docker
  elif command -v podman > /dev/null 2>&1; then
    runtime=podman
  elif [[ ${LB_DRY_RUN:-0} == 1 ]]; then
    runtime=docker
  else
    echo "build_image.sh: neither a docker daemon (docker info) nor podman answers; install one" >&2
    exit 2
  fi
fi

build=("$runtime" build)
case $runtime in
  docker) export DOCKER_BUILDKIT=1 ;;  # RUN --mount and COPY --chmod need BuildKit
  podman) build+=(--format docker) ;;  # Docker's image format: the same image either way
esac
[[ -n ${BASE_IMAGE:-} ]] && build+=(--build-arg "BASE_IMAGE=$BASE_IMAGE")

one() {  # one DOCKERFILE TAG: build it, or print the command under LB_DRY_RUN=1
  local cmd=("${build[@]}" -f "$1" -t "$2" "${@:3}" .)
  if [[ ${LB_DRY_RUN:-0} == 1 ]]; then
    local line
    printf -v line '%q ' "${cmd[@]}"
    echo "${line% }"
  else
    echo "+ ${cmd[*]}" >&2
    "${cmd[@]}"
  fi
}

if [[ $which != tpu ]]; then one Dockerfile largebatch "$@"; fi
if [[ $which != gpu ]]; then one Dockerfile.tpu largebatch-tpu "$@"; fi
