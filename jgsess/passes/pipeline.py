"""The pipeline: every pass, in order, in one list [GPUSession::CompileGraphImpl]."""

from __future__ import annotations

from . import (
    add_any,
    bucket_all_reduce,
    canonicalize,
    casts,
    combine,
    dce,
    fold_casts,
    plan,
    select,
    transposes,
    widen,
)
from .fusions import (
    fold_clip,
    fuse_adamw,
    fuse_batch_norm,
    fuse_cast_all,
    fuse_global_norm,
    fuse_momentum,
    fuse_relu_mask,
)
from .manager import Pass


def default_pipeline() -> list[Pass]:
    return [
        # optimize: device-independent rewrites (GPUSession::Optimize)
        canonicalize.PASS,
        casts.PASS,
        widen.PASS,
        transposes.PAIR_PASS,
        transposes.DEDUP_PASS,
        add_any.PASS,
        dce.PASS,
        fuse_batch_norm.PASS,
        fuse_global_norm.PASS,
        fuse_adamw.PASS,
        fuse_momentum.PASS,
        fold_clip.PASS,
        fold_casts.PASS,
        combine.PASS,
        dce.PASS,
        fuse_cast_all.PASS,
        # select: a compiled kernel or XLA's code for each fused node (GPUSession::SelectKernel)
        select.PASS,
        # hardware: platform passes that need the kernel decisions (GPUSession::HardwareOptimize)
        fuse_relu_mask.PASS,
        bucket_all_reduce.PASS,
        dce.PASS,
        # plan: in-place results, the workspace arena, the memory plan (KernelRuntime::AssignMemory)
        plan.PASS,
    ]
