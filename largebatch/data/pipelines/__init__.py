"""The input pipelines, one module each; every loader they build satisfies
:class:`largebatch.data.contract.Loader`.

=================  ==================================================================
module             ``data.loader`` / what it reads
=================  ==================================================================
``torchvision``    ``torchvision``: Pillow decode and PIL transforms in DataLoader workers
``nvjpeg``         ``nvjpeg``: workers read bytes, torchvision's nvJPEG decodes on the device
``dali_files``     ``dali`` over image folders or the data check's file lists
``dali_shards``    ``dali`` with ``data.shards=DIR``: packed WebDataset shards
``dali_graph``     what both DALI readers share: availability, the decode/crop/normalise graph
=================  ==================================================================

The four builders are importable from here; each loads its module (and DALI, or nvJPEG) on
first use (PEP 562), so importing this package loads none of them.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "build_loaders": "torchvision",
    "build_nvjpeg_loaders": "nvjpeg",
    "build_dali_loaders": "dali_files",
    "build_dali_shard_loaders": "dali_shards",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
