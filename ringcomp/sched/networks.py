"""Published networks as tables: ResNet-50, VGG-16 and BERT-base's parameter tensors, in
their modules, and each module's forward FLOPs per sample. Pure data, shared by the
planners (``sched.workload``) and the replay models (``models.replay``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReplayLayer:
    """One module of the network: its parameter tensors and its forward FLOPs per sample."""

    name: str
    tensors: tuple[tuple[str, tuple[int, ...]], ...]
    flops: float


def _conv(name, c_in, c_out, k, out_side, bias=False) -> ReplayLayer:
    tensors = (("weight", (c_out, c_in, k, k)),) + ((("bias", (c_out,)),) if bias else ())
    return ReplayLayer(name, tensors, 2.0 * out_side ** 2 * k * k * c_in * c_out)


def _norm(name, channels, elements) -> ReplayLayer:
    """BatchNorm / LayerNorm: a scale and a shift, a few FLOPs per activation."""
    return ReplayLayer(name, (("weight", (channels,)), ("bias", (channels,))), 4.0 * elements)


def _linear(name, fan_in, fan_out, rows=1) -> ReplayLayer:
    return ReplayLayer(name, (("weight", (fan_out, fan_in)), ("bias", (fan_out,))),
                       2.0 * rows * fan_in * fan_out)


def resnet50() -> list[ReplayLayer]:
    """torchvision's ResNet-50 (v1.5, stride on the 3x3 conv) at 224x224: 25,557,032
    parameters in 161 tensors."""
    layers = [_conv("conv1", 3, 64, 7, 112), _norm("bn1", 64, 64 * 112 ** 2)]
    c_in, side = 64, 56
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512),
                                                strict=True), start=1):
        out_side = side if stage == 1 else side // 2
        for block in range(blocks):
            first_side = side if block == 0 else out_side
            prefix = f"layer{stage}.{block}"
            layers += [_conv(f"{prefix}.conv1", c_in, width, 1, first_side),
                       _norm(f"{prefix}.bn1", width, width * first_side ** 2),
                       _conv(f"{prefix}.conv2", width, width, 3, out_side),
                       _norm(f"{prefix}.bn2", width, width * out_side ** 2),
                       _conv(f"{prefix}.conv3", width, 4 * width, 1, out_side),
                       _norm(f"{prefix}.bn3", 4 * width, 4 * width * out_side ** 2)]
            if block == 0:
                layers += [_conv(f"{prefix}.downsample.0", c_in, 4 * width, 1, out_side),
                           _norm(f"{prefix}.downsample.1", 4 * width,
                                 4 * width * out_side ** 2)]
            c_in = 4 * width
        side = out_side
    return layers + [_linear("fc", 2048, 1000)]


def vgg16() -> list[ReplayLayer]:
    """torchvision's VGG-16 (no batch norm) at 224x224: 138,357,544 parameters in 32
    tensors."""
    layers, c_in, side = [], 3, 224
    for block, (convs, width) in enumerate(zip((2, 2, 3, 3, 3), (64, 128, 256, 512, 512),
                                               strict=True)):
        for i in range(convs):
            layers.append(_conv(f"features.{block}.{i}", c_in, width, 3, side, bias=True))
            c_in = width
        side //= 2
    return layers + [_linear("classifier.0", 512 * 7 * 7, 4096),
                     _linear("classifier.3", 4096, 4096), _linear("classifier.6", 4096, 1000)]


def bert_base(seq: int = 128) -> list[ReplayLayer]:
    """BERT-base (uncased; 12 layers, hidden 768, 12 heads, vocabulary 30522) with its
    pooler, at sequence length ``seq``: 109,482,240 parameters in 199 tensors. The
    attention score and context products (no parameters) are counted with the attention
    output projection."""
    hidden, inner = 768, 3072
    layers = [ReplayLayer("embeddings", (("word", (30522, hidden)), ("position", (512, hidden)),
                                         ("token_type", (2, hidden))), 3.0 * seq * hidden),
              _norm("embeddings.LayerNorm", hidden, seq * hidden)]
    for i in range(12):
        prefix = f"encoder.layer.{i}"
        attention = _linear(f"{prefix}.attention.output.dense", hidden, hidden, seq)
        layers += [_linear(f"{prefix}.attention.self.{name}", hidden, hidden, seq)
                   for name in ("query", "key", "value")]
        layers += [ReplayLayer(attention.name, attention.tensors,
                               attention.flops + 4.0 * seq * seq * hidden),
                   _norm(f"{prefix}.attention.output.LayerNorm", hidden, seq * hidden),
                   _linear(f"{prefix}.intermediate.dense", hidden, inner, seq),
                   _linear(f"{prefix}.output.dense", inner, hidden, seq),
                   _norm(f"{prefix}.output.LayerNorm", hidden, seq * hidden)]
    return layers + [_linear("pooler.dense", hidden, hidden)]


NETWORKS = {"resnet50": resnet50, "vgg16": vgg16, "bert-base": bert_base}


def backward_tensors(layers: list[ReplayLayer]) -> list[tuple[int, str, tuple[int, ...]]]:
    """(layer index, tensor name, shape) of every parameter tensor, in backward order (the
    order gradients become final, and the layout of the flat parameter store)."""
    return [(i, name, shape) for i in reversed(range(len(layers)))
            for name, shape in layers[i].tensors]
