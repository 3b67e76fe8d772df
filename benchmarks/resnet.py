"""flax.linen ResNets for the train-step benchmark: ResNet-18 (basic blocks) and ResNet-50
(bottlenecks), NHWC, BatchNorm in training mode, a small-image stem (flax's examples/imagenet
architecture)."""

from __future__ import annotations

from functools import partial

import flax.linen as nn

# training-mode BatchNorm: batch statistics, running averages with momentum 0.9
norm = partial(nn.BatchNorm, use_running_average=False, momentum=0.9)


class Block(nn.Module):
    """A residual block of `filters` channels (four times as many out of a bottleneck), its
    first spatial convolution strided by `strides`."""

    filters: int
    strides: int = 1

    def join(self, x, y):
        """relu(x + y), x projected (1x1 convolution + BatchNorm) where its shape is not y's."""
        if x.shape != y.shape:
            x = norm()(nn.Conv(y.shape[-1], (1, 1), self.strides, use_bias=False)(x))
        return nn.relu(x + y)


class BasicBlock(Block):
    @nn.compact
    def __call__(self, x):
        y = nn.Conv(self.filters, (3, 3), self.strides, use_bias=False)(x)
        y = nn.relu(norm()(y))
        y = nn.Conv(self.filters, (3, 3), use_bias=False)(y)
        y = norm(scale_init=nn.initializers.zeros)(y)
        return self.join(x, y)


class Bottleneck(Block):
    @nn.compact
    def __call__(self, x):
        y = nn.relu(norm()(nn.Conv(self.filters, (1, 1), use_bias=False)(x)))
        y = nn.relu(norm()(nn.Conv(self.filters, (3, 3), self.strides, use_bias=False)(y)))
        y = norm(scale_init=nn.initializers.zeros)(
            nn.Conv(self.filters * 4, (1, 1), use_bias=False)(y)
        )
        return self.join(x, y)


class ResNet(nn.Module):
    """flax's examples/imagenet ResNet, NHWC, with a small-image stem."""

    stages: tuple
    block: type
    classes: int = 10

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(64, (3, 3), use_bias=False)(x)
        x = nn.relu(norm()(x))
        for i, count in enumerate(self.stages):
            for b in range(count):
                x = self.block(64 * 2**i, 2 if b == 0 and i > 0 else 1)(x)
        return nn.Dense(self.classes)(x.mean(axis=(1, 2)))


MODELS = {
    "resnet18": ResNet((2, 2, 2, 2), BasicBlock),
    "resnet50": ResNet((3, 4, 6, 3), Bottleneck),
}
