"""Write scripts/torch-objects.inv: the torch objects the API reference names, as a Sphinx
inventory (version 2) that mkdocstrings reads (mkdocs.yml, ``inventories:``), so ``Optimizer``,
``Tensor`` or ``nn.SyncBatchNorm`` on the page link to torch's documentation.

Why not torch's own ``objects.inv`` by URL: mkdocstrings logs an error when it cannot download
an inventory, and ``mkdocs build --strict`` then fails on every machine without network. So the
few objects the page needs are written here, by hand, with the addresses torch's documentation
gives them (https://docs.pytorch.org/docs/stable/; a class has its own page under ``generated/``
except those documented on a topic page), and the file is committed. Run
``python scripts/torch_inventory.py`` after changing the table (a test checks that the committed
file is what this writes), and remove mkdocs' copy of the old one: mkdocs keeps an inventory a
day, in ``~/.cache/mkdocs/mkdocs_url_cache/``.
"""

from __future__ import annotations

import zlib
from pathlib import Path

OUT = Path(__file__).resolve().parent / "torch-objects.inv"
BASE_URL = "https://docs.pytorch.org/docs/stable/"  # mkdocs.yml's base_url for this file

# name -> (Sphinx role, page#anchor under BASE_URL)
OBJECTS: dict[str, tuple[str, str]] = {
    "torch.Tensor": ("py:class", "tensors.html#torch.Tensor"),
    "torch.device": ("py:class", "tensor_attributes.html#torch.device"),
    "torch.dtype": ("py:class", "tensor_attributes.html#torch.dtype"),
    "torch.optim.Optimizer": ("py:class", "optim.html#torch.optim.Optimizer"),
    "torch.nn.Module": ("py:class", "generated/torch.nn.Module.html#torch.nn.Module"),
    "torch.nn.Parameter": ("py:class", "generated/torch.nn.parameter.Parameter.html#torch.nn.parameter.Parameter"),
    "torch.nn.BatchNorm2d": ("py:class", "generated/torch.nn.BatchNorm2d.html#torch.nn.BatchNorm2d"),
    "torch.nn.SyncBatchNorm": ("py:class", "generated/torch.nn.SyncBatchNorm.html#torch.nn.SyncBatchNorm"),
    "torch.nn.SyncBatchNorm.convert_sync_batchnorm": (
        "py:method", "generated/torch.nn.SyncBatchNorm.html#torch.nn.SyncBatchNorm.convert_sync_batchnorm"),
    "torch.optim.lr_scheduler.LambdaLR": (
        "py:class", "generated/torch.optim.lr_scheduler.LambdaLR.html#torch.optim.lr_scheduler.LambdaLR"),
    "torch.nn.parallel.DistributedDataParallel": (
        "py:class", "generated/torch.nn.parallel.DistributedDataParallel.html"
                    "#torch.nn.parallel.DistributedDataParallel"),
}


def inventory() -> bytes:
    header = ("# Sphinx inventory version 2\n# Project: PyTorch\n# Version: stable\n"
              "# The remainder of this file is compressed using zlib.\n")
    body = "".join(f"{name} {role} 1 {uri} -\n" for name, (role, uri) in sorted(OBJECTS.items()))
    return header.encode() + zlib.compress(body.encode(), 9)


if __name__ == "__main__":
    OUT.write_bytes(inventory())
    print(f"wrote {OUT} ({len(OBJECTS)} objects)")
