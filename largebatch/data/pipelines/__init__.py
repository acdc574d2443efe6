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
``decoded``        ``decoded``: a decoded store made once, batched crops in a background thread
=================  ==================================================================

The five builders are importable from here; each loads its module (and DALI, or nvJPEG) on
first use (PEP 562), so importing this package loads none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from largebatch.lazy import lazy_exports

if TYPE_CHECKING:  # the names, as static tools and readers see them ("X as X": a re-export)
    from largebatch.data.pipelines.dali_files import build_dali_loaders as build_dali_loaders
    from largebatch.data.pipelines.dali_shards import build_dali_shard_loaders as build_dali_shard_loaders
    from largebatch.data.pipelines.decoded import build_decoded_loaders as build_decoded_loaders
    from largebatch.data.pipelines.nvjpeg import build_nvjpeg_loaders as build_nvjpeg_loaders
    from largebatch.data.pipelines.torchvision import build_loaders as build_loaders

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "build_loaders": "torchvision",
    "build_nvjpeg_loaders": "nvjpeg",
    "build_dali_loaders": "dali_files",
    "build_dali_shard_loaders": "dali_shards",
    "build_decoded_loaders": "decoded",
})
