# GPU training image: largebatch[dali] on torch 2.14.1 (the CUDA 13.0 build from PyPI).
#
#   docker build -t largebatch .                  # or scripts/build_image.sh (docker or podman)
#   mkdir -p runs     # yours: a folder docker run creates for -v belongs to root, and the job can't write it
#   docker run --rm --gpus all --ipc=host --stop-timeout 60 --user "$(id -u):$(id -g)" \
#       -v /data/imagenet:/data/imagenet:ro -v "$PWD/runs:/workspace/runs" largebatch \
#       data=imagenet data.root=/data/imagenet model=resnet50
#   # all GPUs of the machine, one process each (the script restarts under tini as PID 1):
#   docker run --rm --gpus all --ipc=host --stop-timeout 60 --user "$(id -u):$(id -g)" \
#       -v "$PWD/runs:/workspace/runs" --entrypoint /opt/largebatch/launch/torchrun.sh largebatch optimizer=lars
# docker stop (SIGTERM) saves a checkpoint and exits 75 with either entry point; continue with
# the same command plus run_dir=runs/<the run> resume=auto. --stop-timeout 60 (Kubernetes:
# terminationGracePeriodSeconds) leaves time for the current step and the checkpoint write:
# docker's default is 10 s.
#
# Needs BuildKit (Docker >= 23's default builder) or podman/buildah for RUN --mount and
# COPY --chmod; no "# syntax=" line, so the build fetches no front end from a registry.
# Base: a slim Python, not nvidia/cuda:13.0.x-cudnn-runtime. The torch wheel carries its own
# CUDA 13.0 user-space libraries (cuBLAS, cuDNN, NCCL, NVRTC, ... as nvidia-* wheels) and DALI
# brings nvImageCodec/nvJPEG/nvCOMP the same way; the one piece from the host is the driver
# (libcuda), which the NVIDIA Container Toolkit mounts in (host driver >= 580 for CUDA 13.0).
# A CUDA runtime base would add a second ~3 GB copy of those libraries, at other versions.
# Python 3.11 on Debian 12 is what the tests run on (scripts/setup_env.sh).
ARG BASE_IMAGE=python:3.11-slim-bookworm

# ---- dependencies: rebuilt only when constraints/main.txt, setup.py or pyproject.toml change
FROM ${BASE_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv \
    && pip install --upgrade pip==26.3 setuptools==84.2.1 wheel==0.48.0
WORKDIR /build
COPY constraints/main.txt constraints/main.txt
# torch first and pinned, as scripts/setup_env.sh does, so nothing later pulls another build;
# its own layer: ~5 GB that changes only with the torch pin.
RUN pip install -c constraints/main.txt torch torchvision
COPY setup.py pyproject.toml ./
# The package's other dependencies (with the dali extra) from setup.py alone: an empty
# package stands in for the source, so editing code does not rebuild this layer.
RUN mkdir -p largebatch conf \
    && touch README.md largebatch/__init__.py conf/__init__.py \
    && pip install -c constraints/main.txt ".[dali]" \
    && pip uninstall -y largebatch

# ---- the package as a wheel, built in a throw-away stage from copies of the allow-listed folders
# (.dockerignore applies to COPY): nothing is written to the build context. A writable bind mount
# of the context wrote through to the user's checkout with podman/buildah 4.3 (root-owned build/
# and largebatch.egg-info/, stale build/lib files reaching a later image) and ignored .dockerignore.
FROM deps AS wheel
WORKDIR /src
COPY setup.py pyproject.toml README.md ./
COPY conf/ conf/
COPY largebatch/ largebatch/
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
    && ls /wheels/largebatch-*.whl

# ---- the image
FROM ${BASE_IMAGE}
# tini as PID 1 forwards SIGTERM (docker stop, preemption) to the trainer and reaps
# data-loader workers; a Python PID 1 without a SIGTERM handler would ignore it. Pinned to the
# upstream release (any Debian rebuild of it): launch/lib.sh relies on nothing newer.
# User app (uid 1000) runs the job; /workspace is open to any uid (sticky, like /tmp) so that
# --user "$(id -u):$(id -g)" can write into a runs/ folder mounted from the host.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini=0.19.0-* \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 --shell /bin/bash app \
    && mkdir -p /workspace \
    && chmod 1777 /workspace
COPY --from=deps /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    XDG_CACHE_HOME=/workspace/.cache \
    LARGEBATCH_CACHE=/workspace/.cache/largebatch
# The package itself, from the wheel stage (a regular install: conf/ becomes largebatch.conf); the
# wheel is mounted read-only for this step and lands in no layer.
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    pip install --no-deps /wheels/largebatch-*.whl \
    && largebatch-train --help > /dev/null
COPY --chmod=0755 launch/ /opt/largebatch/launch/
USER 1000:1000
WORKDIR /workspace
ENTRYPOINT ["tini", "--", "largebatch-train"]
CMD []
