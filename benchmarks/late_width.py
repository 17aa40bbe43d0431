"""How much inner width can buy the ResNet of `your_model.py`, from the start and added late: a plain PyTorch loop.

The ResNet-20 at width 4 (digits at 32x32x3) is trained without morphogen, by the same recipe as its
benchmark (SGD lr 0.01, momentum 0.9, weight decay 5e-4, batch 64, cosine over 30 epochs), in variants:

- `host`: every residual block as written (inner width = the stream's width);
- `wide`: every block with `--expansion` times the channels between its two convolutions, from scratch;
- `late E`: the same wide blocks whose new inner channels start with zero outgoing weights and stay out of
  training until epoch E (the network computes the host's function until then): width added mid-training,
  function-preserving, which is what growth does.

It measures the room growth has on this model and the time at which adding width still pays; morphogen's
growth of the same model is in `your_model.py`. Accuracy per variant (mean ± std over seeds) and its gain
over `host`, paired by seed (mean ± standard error).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

import torch
from torch import Tensor, nn

from growth import mean_standard_error, mean_std
from your_model import HOST_WIDTH, BasicBlock, CifarResNet, digits_32x32x3

EPOCHS, BATCH, LEARNING_RATE = 30, 64, 0.01


def new_channel_masks(net: CifarResNet, expansion: int) -> dict[nn.Parameter, Tensor]:
    """Per parameter of the new inner channels, a mask that is 0 on them; their outgoing weights are zeroed."""
    masks: dict[nn.Parameter, Tensor] = {}
    for block in net.modules():
        if not isinstance(block, BasicBlock):
            continue
        old = block.conv1.out_channels // expansion
        with torch.no_grad():
            block.conv2.weight[:, old:] = 0  # function-preserving: the new channels reach nothing yet
        for parameter, rows in ((block.conv1.weight, True), (block.bn1.weight, True), (block.bn1.bias, True),
                                (block.conv2.weight, False)):
            mask = torch.ones_like(parameter)
            if rows:
                mask[old:] = 0
            else:
                mask[:, old:] = 0
            masks[parameter] = mask
    return masks


def train(job: tuple[str, int, int, int]) -> tuple[str, int, float]:
    """Validation accuracy of variant `name` (host, wide, late) trained from `seed`; `start` is late's epoch."""
    name, seed, expansion, start = job
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    (x, y), (x_validation, y_validation) = digits_32x32x3()
    net = CifarResNet(expansion=1 if name == "host" else expansion)
    masks = new_channel_masks(net, expansion) if name == "late" else {}
    optimizer = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE, momentum=0.9, weight_decay=5e-4)
    order = torch.Generator().manual_seed(seed)
    for epoch in range(EPOCHS):
        for group in optimizer.param_groups:
            group["lr"] = LEARNING_RATE * 0.5 * (1 + math.cos(math.pi * epoch / EPOCHS))
        frozen = epoch < start
        net.train()
        permutation = torch.randperm(len(x), generator=order)
        for first in range(0, len(x), BATCH):
            batch = permutation[first:first + BATCH]
            loss = nn.functional.cross_entropy(net(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            if frozen:
                for parameter, mask in masks.items():
                    assert parameter.grad is not None
                    parameter.grad.mul_(mask)
            optimizer.step()
            if frozen:  # weight decay moves every weight: keep the outgoing ones of the new channels at zero
                with torch.no_grad():
                    for parameter, mask in masks.items():
                        if parameter.dim() == 4 and not mask[:, -1].any():
                            parameter.mul_(mask)
    net.eval()
    with torch.no_grad():
        accuracy = (net(x_validation).argmax(1) == y_validation).float().mean().item() * 100
    return f"late {start}" if name == "late" else name, seed, accuracy


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--expansion", type=int, default=4)
    parser.add_argument("--late", default="6,12", help="epochs at which the new channels start learning")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes, one torch thread each")
    args = parser.parse_args(argv)
    starts = [int(epoch) for epoch in args.late.split(",") if epoch.strip()]
    variants = [("host", 0), ("wide", 0), *(("late", start) for start in starts)]
    jobs = [(name, seed, args.expansion, start) for name, start in variants for seed in range(args.seeds)]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(train, jobs))
    host = {seed: accuracy for name, seed, accuracy in results if name == "host"}
    print(f"ResNet-20 width {HOST_WIDTH}, inner width x{args.expansion}, plain loop, {args.seeds} seeds")
    for label in dict.fromkeys(name for name, _, _ in results):
        accuracies = {seed: accuracy for name, seed, accuracy in results if name == label}
        mean, spread = mean_std(list(accuracies.values()))
        line = f"  {label:10}{mean:>8.2f} ± {spread:.2f}%"
        if label != "host" and len(accuracies) >= 2:
            gain, error = mean_standard_error([accuracy - host[seed] for seed, accuracy in accuracies.items()])
            line += f"   - host, paired by seed: {gain:+.2f} ± {error:.2f} points"
        print(line)


if __name__ == "__main__":
    main()
