"""The pipeline: every pass, in order, in one list [GPUSession::CompileGraphImpl]."""

from __future__ import annotations

from . import (
    bucket_all_reduce,
    combine_optimizers,
    dce,
    dedup,
    fold_casts,
    plan_memory,
    select_kernels,
    widen_narrow_products,
)
from .cleanups import CLEANUPS
from .fusions import (
    fold_clip,
    fuse_adamw,
    fuse_batch_norm_relu,
    fuse_cast_all,
    fuse_global_norm,
    fuse_momentum,
    fuse_registered,
    fuse_relu_mask,
)
from .manager import Pass


def default_pipeline() -> list[Pass]:
    return [
        # optimize: the device-independent clean-ups, then the rewrites and fusions
        # (GPUSession::Optimize)
        *CLEANUPS,
        widen_narrow_products.PASS,
        dedup.CONVERT_PASS,  # the widenings it made of values widened already
        dce.PASS,
        fuse_registered.PASS,  # the users' kernels (jgsess.register_replacement) first
        fuse_batch_norm_relu.PASS,
        fuse_global_norm.PASS,
        fuse_adamw.PASS,
        fuse_momentum.PASS,
        fold_clip.PASS,
        fold_casts.PASS,
        combine_optimizers.PASS,
        dce.PASS,
        fuse_cast_all.PASS,
        # select: a compiled kernel or XLA's code for each fused node (GPUSession::SelectKernel)
        select_kernels.PASS,
        # hardware: platform passes that need the kernel decisions (GPUSession::HardwareOptimize)
        fuse_relu_mask.PASS,
        bucket_all_reduce.PASS,
        dce.PASS,
        # plan: in-place results, the workspace arena, the memory plan (KernelRuntime::AssignMemory)
        plan_memory.PASS,
    ]
