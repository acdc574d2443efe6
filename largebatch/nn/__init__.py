"""Neural-network building blocks for large-batch training: grouped synchronized BatchNorm.

The layer and its conversions live in ``largebatch.nn.sync_bn``; the reducers that carry its
one collective (and pick it for the running program) in ``largebatch.comm.reducers``.
"""

from largebatch.comm.reducers import (
    GroupReducer,
    LocalReducer,
    ProcessGroupReducer,
    default_group_reducer,
    destroy_process_groups,
    process_group_reducer,
    rank_subgroup,
    resolve_group_size,
)
from largebatch.nn.sync_bn import (
    GroupSyncBatchNorm,
    GroupSyncBatchNormAct,
    convert_group_sync_batchnorm,
    convert_torch_sync_batchnorm,
)

__all__ = [
    "GroupReducer",
    "GroupSyncBatchNorm",
    "GroupSyncBatchNormAct",
    "LocalReducer",
    "ProcessGroupReducer",
    "convert_group_sync_batchnorm",
    "convert_torch_sync_batchnorm",
    "default_group_reducer",
    "destroy_process_groups",
    "process_group_reducer",
    "rank_subgroup",
    "resolve_group_size",
]
