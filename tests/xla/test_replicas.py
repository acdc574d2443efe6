"""Four XLA:CPU replicas (threads of one process): the backend's collectives are correct.

Each test runs ``python -m tests.xla.replicas SCENARIO OUT_DIR`` with ``CPU_NUM_DEVICES=4``
(the replicas are started by the project's own launcher, which applies the XLA:CPU measures
of ``largebatch.backends.xla``) and checks what every replica saved against references
computed here, on the host. Only the known upstream crashes ("pure virtual method called", a
segmentation fault in the runtime: ``tests.xla.common.UPSTREAM_CRASHES``) are retried, a bounded number of times, and every retry is reported (warning + a line in
``.cache/xla_upstream_crashes.log``); any other failure fails the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.xla import replicas as R
from tests.xla.common import failure_text, max_abs_diff, run_replicas

pytestmark = pytest.mark.xla

WORLD = 4
ATOL = 1e-5


def _run(scenario: str, tmp_path: Path) -> list[dict]:
    pytest.importorskip("torch_xla")
    proc, retries = run_replicas(scenario, tmp_path, devices=WORLD)
    assert proc.returncode == 0, failure_text(proc)
    outs = [torch.load(tmp_path / f"{scenario}_{r}.pt", weights_only=False) for r in range(WORLD)]
    assert [o["rank"] for o in outs] == list(range(WORLD))
    assert all(o["world_size"] == WORLD for o in outs)
    return outs


def _bn_reference(group: list[int]) -> dict[str, torch.Tensor]:
    """torch BatchNorm2d on the group's concatenated batch: outputs, grads, running stats."""
    xs, dys = zip(*(R.bn_inputs(r) for r in group))
    weight, bias = R.bn_parameters()
    bn = nn.BatchNorm2d(R.BN_SHAPE[1], momentum=0.1)
    with torch.no_grad():
        bn.weight.copy_(weight)
        bn.bias.copy_(bias)
    x = torch.cat(xs).requires_grad_(True)
    y = bn(x)
    y.backward(torch.cat(dys))
    n = R.BN_SHAPE[0]
    return {
        "y": [y.detach()[i * n : (i + 1) * n] for i in range(len(group))],
        "dx": [x.grad[i * n : (i + 1) * n] for i in range(len(group))],
        "dweight": bn.weight.grad,
        "dbias": bn.bias.grad,
        "running_mean": bn.running_mean,
        "running_var": bn.running_var,
    }


def test_group_sync_batchnorm_matches_batchnorm_on_the_group_batch(tmp_path: Path) -> None:
    """GroupSyncBatchNorm on XLA replicas, group sizes 1, 2, 4 == BatchNorm2d of the group."""
    outs = _run("sync_bn", tmp_path)
    for g in R.GROUP_SIZES:
        for start in range(0, WORLD, g):
            group = list(range(start, start + g))
            ref = _bn_reference(group)
            # weight/bias gradients are each replica's share; the group's sum is BatchNorm's
            dweight = sum(outs[r][f"g{g}"]["dweight"] for r in group)
            dbias = sum(outs[r][f"g{g}"]["dbias"] for r in group)
            assert max_abs_diff(dweight, ref["dweight"]) < 1e-4, f"group size {g}, group {group}"
            assert max_abs_diff(dbias, ref["dbias"]) < 1e-4, f"group size {g}, group {group}"
            for i, r in enumerate(group):
                got = outs[r][f"g{g}"]
                where = f"group size {g}, replica {r}"
                assert max_abs_diff(got["y"], ref["y"][i]) < ATOL, where
                assert max_abs_diff(got["dx"], ref["dx"][i]) < ATOL, where
                assert max_abs_diff(got["running_mean"], ref["running_mean"]) < ATOL, where
                assert max_abs_diff(got["running_var"], ref["running_var"]) < ATOL, where


def test_training_keeps_replicas_identical(tmp_path: Path) -> None:
    """A few Trainer steps (global BN, SGD) leave the same weights on every replica, and
    the weights moved (replicas started from different weights: rank 0's were broadcast)."""
    outs = _run("train", tmp_path)
    first = outs[0]["state"]
    for r in range(1, WORLD):
        for name, value in outs[r]["state"].items():
            assert max_abs_diff(value.float(), first[name].float()) < 1e-6, f"{name} differs on replica {r}"
    start = outs[0]["start_state"]  # rank 0's weights, broadcast before the first step
    for o in outs[1:]:
        assert all(torch.equal(o["start_state"][k], v) for k, v in start.items()), "replicas started apart"
    moved = [n for n, v in first.items() if v.dtype.is_floating_point and max_abs_diff(v, start[n]) > 1e-4]
    assert any(n.endswith("weight") for n in moved), "no parameter changed in training"


def test_host_collectives_and_exact_padded_evaluation(tmp_path: Path) -> None:
    """all-reduce, object broadcast, and evaluation counting every image once (10 and 2
    images over 4 replicas: uneven shards and replicas with none)."""
    outs = _run("collectives", tmp_path)
    expected_sum = torch.full((3,), float(sum(range(1, WORLD + 1))))
    for o in outs:
        assert torch.equal(o["sum"], expected_sum)
        assert o["object"] == {"rank": 0, "text": "x" * 100}
    from tests.xla.common import tiny_resnet

    state = outs[0]["model_state"]
    for o in outs[1:]:  # prepare_model broadcast rank 0's weights to every replica
        assert all(torch.equal(o["model_state"][k], v) for k, v in state.items())
    model = tiny_resnet().eval()
    model.load_state_dict(state)
    for n in (10, 2):
        totals = {o[f"eval{n}"]["total"] for o in outs}
        assert totals == {n}, f"eval of {n} images counted {totals}"
        images, labels = R.eval_data(n)
        with torch.no_grad():
            correct1 = int((model(images).argmax(1) == labels).sum())
        assert outs[0][f"eval{n}"]["correct1"] == correct1
        # every replica reports the same all-reduced metrics and ran the same batch count
        assert len({round(o[f"eval{n}"]["top1"], 6) for o in outs}) == 1
        assert len({o[f"eval{n}_batches"] for o in outs}) == 1
