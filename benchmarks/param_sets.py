"""Parameter shapes of three real models, for optimizer benchmarks (no model code needed).

resnet50         ~25.6M parameters in 161 arrays (convolutions, BatchNorm scale/bias, fc)
bert-base        ~110M parameters in 199 arrays (embeddings, 12 encoder layers, pooler)
efficientnet-b0  ~5.3M parameters in 213 arrays, most of them small (depthwise kernels,
                 BatchNorm and squeeze-excite parameters)
small-1000       ~2.5M parameters in 1,000 arrays of 1K-4K elements (a call's fixed costs)
"""

from __future__ import annotations


def _bn(c: int) -> list[tuple[int, ...]]:
    return [(c,), (c,)]


def resnet50() -> list[tuple[int, ...]]:
    shapes = [(7, 7, 3, 64), *_bn(64)]
    cin = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(1, 1, cin, width), *_bn(width), (3, 3, width, width), *_bn(width)]
            shapes += [(1, 1, width, 4 * width), *_bn(4 * width)]
            if b == 0:
                shapes += [(1, 1, cin, 4 * width), *_bn(4 * width)]
            cin = 4 * width
    return shapes + [(2048, 1000), (1000,)]


def bert_base() -> list[tuple[int, ...]]:
    h, ff = 768, 3072
    shapes = [(30522, h), (512, h), (2, h), (h,), (h,)]
    for _ in range(12):
        shapes += [(h, h), (h,)] * 4  # query, key, value, attention output
        shapes += [(h,), (h,), (h, ff), (ff,), (ff, h), (h,), (h,), (h,)]
    return shapes + [(h, h), (h,)]


# EfficientNet-B0's stages: (expand ratio, kernel, output channels, repeats, first stride)
EFFICIENTNET_B0_STAGES = (
    (1, 3, 16, 1, 1),
    (6, 3, 24, 2, 2),
    (6, 5, 40, 2, 2),
    (6, 3, 80, 3, 2),
    (6, 5, 112, 3, 1),
    (6, 5, 192, 4, 2),
    (6, 3, 320, 1, 1),
)


def efficientnet_b0() -> list[tuple[int, ...]]:
    shapes = [(3, 3, 3, 32), *_bn(32)]
    cin = 32
    for expand, k, cout, repeats, _ in EFFICIENTNET_B0_STAGES:
        for _ in range(repeats):
            mid = cin * expand
            if expand != 1:
                shapes += [(1, 1, cin, mid), *_bn(mid)]
            squeeze = max(1, cin // 4)
            shapes += [(k, k, 1, mid), *_bn(mid)]  # depthwise
            shapes += [(1, 1, mid, squeeze), (squeeze,), (1, 1, squeeze, mid), (mid,)]  # SE
            shapes += [(1, 1, mid, cout), *_bn(cout)]
            cin = cout
    return shapes + [(1, 1, 320, 1280), *_bn(1280), (1280, 1000), (1000,)]


def small_1000() -> list[tuple[int, ...]]:
    # sizes spread evenly over [1024, 4096], odd ones included (a fixed sequence, no RNG)
    return [(1024 + (i * 2654435761) % 3073,) for i in range(1000)]


SETS = {
    "resnet50": resnet50,
    "bert-base": bert_base,
    "efficientnet-b0": efficientnet_b0,
    "small-1000": small_1000,
}
