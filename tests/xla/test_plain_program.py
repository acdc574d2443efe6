"""largebatch reused in a plain torch-xla program, on four XLA:CPU replicas.

``tests/xla/plain_program.py`` is what another project writes: ``torch_xla.launch``, no
torch.distributed process group, no largebatch backend or launcher; grouped BN by the public
``convert_group_sync_batchnorm(model, group_size=2)`` and LARS/LAMB stepped by
``xm.optimizer_step``. Its results are checked here against single-process references on the
concatenated batch. The environment is the one threaded XLA:CPU needs (the README says so):
``XLA_THREAD_POOL_SIZE=16``; the library itself takes the other measures (sync lock, no
buffer aliasing). Only the known upstream crash is retried (``run_replicas``).
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F
from torch import nn

# plain_program imports torch_xla at module level, as a user's program does: skip (with the
# reason) where torch-xla is absent, so `python -m pytest tests` collects in the main venv.
pytest.importorskip("torch_xla", reason="needs torch-xla (run in .venv-xla with PJRT_DEVICE=CPU)")

from tests.xla import plain_program as P  # noqa: E402
from tests.xla.common import failure_text, max_abs_diff, run_replicas  # noqa: E402

pytestmark = pytest.mark.xla

WORLD = 4
GROUPS = [[0, 1], [2, 3]]


@pytest.fixture(scope="module")
def outs(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    pytest.importorskip("torch_xla")
    out_dir = tmp_path_factory.mktemp("plain")
    proc, _ = run_replicas(
        "plain", out_dir, devices=WORLD, module="tests.xla.plain_program", env={"XLA_THREAD_POOL_SIZE": "16"}
    )
    assert proc.returncode == 0, failure_text(proc)
    results = [torch.load(out_dir / f"plain_{r}.pt", weights_only=False) for r in range(WORLD)]
    assert [o["rank"] for o in results] == list(range(WORLD))
    assert all(o["world_size"] == WORLD for o in results)
    return results


def test_grouped_bn_equals_batchnorm_of_the_group_batch(outs: list[dict]) -> None:
    """Each replica's output and running statistics are BatchNorm2d's on its pair's batch."""
    n = P.BN_SHAPE[0]
    for group in GROUPS:
        bn = nn.BatchNorm2d(P.BN_SHAPE[1])
        y = bn(torch.cat([P.bn_input(r) for r in group])).detach()
        for i, r in enumerate(group):
            got = outs[r]["bn"]
            assert got["type"] == "GroupSyncBatchNorm"
            assert max_abs_diff(got["y"], y[i * n : (i + 1) * n]) < 1e-5, f"replica {r}"
            assert max_abs_diff(got["running_mean"], bn.running_mean) < 1e-5, f"replica {r}"
            assert max_abs_diff(got["running_var"], bn.running_var) < 1e-5, f"replica {r}"
    # the two pairs normalise with different statistics (not one global BN)
    assert max_abs_diff(outs[0]["bn"]["running_mean"], outs[2]["bn"]["running_mean"]) > 0.1


def _reference_training(optimizer_name: str) -> dict[str, torch.Tensor]:
    """One process, the four replicas' batches concatenated; BN over each pair's part."""
    model = P.small_net()
    conv, bn, rest = model[0], model[1], model[2:]
    optimizer = P.OPTIMIZERS[optimizer_name](model.parameters())
    per_replica = [P.train_batches(r) for r in range(WORLD)]
    for step in range(P.STEPS):
        images = torch.cat([per_replica[r][step][0] for r in range(WORLD)])
        labels = torch.cat([per_replica[r][step][1] for r in range(WORLD)])
        h = conv(images)
        h = torch.cat([
            F.batch_norm(part, None, None, bn.weight, bn.bias, True, 0.0, bn.eps)
            for part in h.chunk(len(GROUPS))
        ])
        F.cross_entropy(rest(h), labels).backward()  # mean over the 16 images
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {k: v for k, v in model.state_dict().items() if "running" not in k and "num_batches" not in k}


@pytest.mark.parametrize("optimizer_name", sorted(P.OPTIMIZERS))
def test_lars_lamb_training_matches_one_process_on_the_concatenated_batch(outs: list[dict], optimizer_name: str) -> None:
    """xm.optimizer_step keeps the replicas identical, and their weights are those of one
    process training on the concatenated batch; the weights moved."""
    first = outs[0][optimizer_name]
    for r in range(1, WORLD):
        for name, value in outs[r][optimizer_name].items():
            if "running" in name:  # BN running statistics are per pair
                continue
            assert max_abs_diff(value.float(), first[name].float()) < 1e-6, f"{name} differs on replica {r}"
    start = P.small_net().state_dict()
    for name, expected in _reference_training(optimizer_name).items():
        assert max_abs_diff(first[name], expected) < 2e-5, f"{optimizer_name}: {name}"
        assert max_abs_diff(expected, start[name]) > 1e-3, f"{optimizer_name}: {name} did not move"
