"""Neural-network building blocks for large-batch training: grouped synchronized BatchNorm."""

from largebatch.nn.sync_bn import (
    GroupReducer,
    GroupSyncBatchNorm,
    GroupSyncBatchNormAct,
    LocalReducer,
    ProcessGroupReducer,
    convert_group_sync_batchnorm,
    convert_torch_sync_batchnorm,
    default_group_reducer,
    process_group_reducer,
    rank_subgroup,
    resolve_group_size,
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
    "process_group_reducer",
    "rank_subgroup",
    "resolve_group_size",
]
