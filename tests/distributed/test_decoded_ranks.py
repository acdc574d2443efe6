"""``data.loader=decoded`` on real gloo ranks spread over two "nodes", each with its own cache: the
first rank of each node builds (first run) or checks (every run after) the node's stores, which
lists each split once; the node's other ranks map the stores it has checked without listing the
split again (on ImageNet a listing walks 1.33M files with a ``stat`` each, once per rank before).
Every rank reads every image of its node's stores."""

from __future__ import annotations

import os
from pathlib import Path

from largebatch.data.synthetic import make_synthetic_imagenet
from tests.distributed.harness import run_ranks

# rank -> (node, local rank): ranks 0 and 1 on node "a", rank 2 alone on node "b"
NODES = {0: ("a", 0), 1: ("a", 1), 2: ("b", 0)}


def _open_on_rank(rank: int, world: int, root: str, caches: str) -> dict:
    from largebatch.backends.torch_dist import TorchDistributedBackend
    from largebatch.data import images
    from largebatch.data.build import build_run_loaders
    from largebatch.data.contract import LoaderSpec

    node, local = NODES[rank]
    os.environ["LOCAL_RANK"] = str(local)
    os.environ["LARGEBATCH_CACHE"] = str(Path(caches) / node)
    backend = TorchDistributedBackend("cpu")
    listed: list[str] = []
    real = images.list_class_images

    def counted(split_dir, *args, **kwargs):  # type: ignore[no-untyped-def]
        listed.append(Path(split_dir).name)
        return real(split_dir, *args, **kwargs)

    images.list_class_images = counted  # this rank's own process: put back by its exit
    spec = LoaderSpec(image_size=16, batch_size=4, workers=1, rank=rank, world_size=world)
    runs = []
    for _ in range(2):  # the first run builds the stores, the second opens them
        listed.clear()
        train, val, classes = build_run_loaders(Path(root), spec, loader="decoded", shards=None, backend=backend)
        runs.append({"listed": sorted(listed), "images": (len(train.store), len(val.store)), "classes": classes,
                     "folder": str(Path(train.store.images.filename).parent.parent)})
        train.close()
        val.close()
    return {"runs": runs}


def test_one_rank_per_node_lists_each_split_and_the_others_map_its_stores(tmp_path: Path) -> None:
    root = make_synthetic_imagenet(tmp_path / "ds", num_classes=3, train_per_class=8, val_per_class=3,
                                   image_size=32)
    results = run_ranks(_open_on_rank, 3, str(root), str(tmp_path / "caches"), fork=True, timeout_s=120)
    for rank, result in enumerate(results):
        node, local = NODES[rank]
        for run in result["runs"]:
            assert run["listed"] == ([] if local else ["train", "val"]), (rank, run)
            assert (run["images"], run["classes"]) == ((24, 9), 3), (rank, run)
            assert run["folder"] == str(tmp_path / "caches" / node), (rank, run)
