"""How much inner width can buy the ResNet of `your_model.py`, from the start and added late: a plain PyTorch loop.

The ResNet-20 at width 4 (digits at 32x32x3) is trained without morphogen, by the same recipe as its
benchmark (SGD lr 0.01, momentum 0.9, weight decay 5e-4, batch 64, cosine over 30 epochs), in variants:

- `host`: every residual block as written (inner width = the stream's width);
- `wide`: every block with `--expansion` times the channels between its two convolutions, from scratch;
- `host init` (`--host-init`): the host, its blocks' second convolutions drawn as in the wide blocks (their
  fan-in is `--expansion` times larger, so their initial weights are that many times smaller in variance);
- `late E`: the same wide blocks whose new inner channels start with zero outgoing weights and stay out of
  training until epoch E (the network computes the host's function until then): width added mid-training,
  function-preserving, which is what growth does;
- `serial E`, `parallel E`, `prerelu E`, `inside E` (`--branches`): the host's blocks left as they are, each given a
  branch with `--expansion` times its output channels (3x3 conv, norm, ReLU, 3x3 conv starting at zero)
  that joins at epoch E (`--branch-epoch`): `serial` reads the block's output and adds to it (what
  morphogen's `conv_wide` seed after a block is), `parallel` reads the block's input and adds to its output,
  `prerelu` reads the block's input and adds before the block's last ReLU, and `inside` is new channels between
  the block's convolutions with a norm of their own (`--expansion` - 1 times the block's channels: read from
  the block's input, added to its second convolution's output before its batch norm, as morphogen's
  `wider_inside` seed). The branch's norm is a one-group GroupNorm, as in morphogen's seeds, or a BatchNorm
  (`--branch-norm batch`).

It measures the room growth has on this model and the time at which adding width still pays; morphogen's
growth of the same model is in `your_model.py`. Accuracy per variant (mean ± std over seeds) and its gain
over `host`, paired by seed (mean ± standard error).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

import torch
from torch import Tensor, nn

from arguments import BenchmarkParser, count, run_script, whole_numbers
from morphogen.paired_statistics import format_mean_error, format_mean_std
from your_model import HOST_WIDTH, BasicBlock, CifarResNet, digits_32x32x3

EPOCHS, BATCH, LEARNING_RATE = 30, 64, 0.01  # the benchmark's recipe; `--epochs` shortens a trial run


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


@torch.no_grad()
def init_as_wide(net: CifarResNet, expansion: int) -> None:
    """Scale every block's second convolution as the wide block's is drawn: its fan-in is `expansion` times larger,
    and torch's default bound goes as one over its square root."""
    for block in net.modules():
        if isinstance(block, BasicBlock):
            block.conv2.weight.mul_(1 / math.sqrt(expansion))


BRANCHES = ("serial", "parallel", "prerelu", "inside")


class Branch(nn.Module):
    """conv 3x3 (to `hidden` channels) -> norm -> ReLU -> conv 3x3 (to `out_channels`, zero at birth)."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int, stride: int, norm: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, hidden, 3, stride, 1, bias=False)
        self.norm = nn.BatchNorm2d(hidden) if norm == "batch" else nn.GroupNorm(1, hidden)
        self.conv2 = nn.Conv2d(hidden, out_channels, 3, 1, 1, bias=False)
        nn.init.zeros_(self.conv2.weight)

    def forward(self, x: Tensor) -> Tensor:
        added: Tensor = self.conv2(torch.relu(self.norm(self.conv1(x))))
        return added


class BranchedBlock(nn.Module):
    """A host block with a `Branch` beside it: after it (`serial`), or from its input to its output
    (`parallel`), to the sum before its last ReLU (`prerelu`) or to its second convolution's output (`inside`)."""

    def __init__(self, block: BasicBlock, site: str, expansion: int, norm: str) -> None:
        super().__init__()
        self.block, self.site = block, site
        inputs, outputs = block.conv1.in_channels, block.conv2.out_channels
        serial = site == "serial"
        # Inside, the branch is the block's new inner channels (morphogen's `wider_inside`): 4x as wide in all.
        hidden = (expansion - 1 if site == "inside" else expansion) * outputs
        self.branch = Branch(outputs if serial else inputs, hidden, outputs, 1 if serial else block.conv1.stride[0],
                             norm)

    def forward(self, x: Tensor) -> Tensor:
        block = self.block
        if self.site == "serial":
            y: Tensor = block(x)
            return y + self.branch(y)
        if self.site == "parallel":
            return block(x) + self.branch(x)
        inner = torch.relu(block.bn1(block.conv1(x)))
        if self.site == "inside":
            return torch.relu(block.bn2(block.conv2(inner) + self.branch(x)) + block.shortcut(x))
        return torch.relu(block.bn2(block.conv2(inner)) + block.shortcut(x) + self.branch(x))


def add_branches(net: CifarResNet, site: str, expansion: int, norm: str) -> list[nn.Parameter]:
    """Give every block of `net` a branch at `site`; the branches' parameters."""
    added: list[nn.Parameter] = []
    for stage in (net.layer1, net.layer2, net.layer3):
        for index, block in enumerate(stage):
            branched = BranchedBlock(block, site, expansion, norm)
            stage[index] = branched
            added += branched.branch.parameters()
    return added


def train(job: tuple[str, int, int, int, str, int]) -> tuple[str, int, float]:
    """Validation accuracy of variant `name` (host, wide, late, a branch site) trained from `seed` for `epochs`;
    `start` is the epoch at which late channels or branches join, `norm` the branches' norm."""
    name, seed, expansion, start, norm, epochs = job
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    (x, y), (x_validation, y_validation) = digits_32x32x3()
    net = CifarResNet(expansion=expansion if name in ("wide", "late") else 1)
    masks = new_channel_masks(net, expansion) if name == "late" else {}
    if name == "host init":
        init_as_wide(net, expansion)
    # A branch's parameters get no gradient before `start` (SGD then leaves them, weight decay included),
    # so its zero second conv keeps the host's function until then.
    branch = add_branches(net, name, expansion, norm) if name in BRANCHES else []
    optimizer = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE, momentum=0.9, weight_decay=5e-4)
    order = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        for group in optimizer.param_groups:
            group["lr"] = LEARNING_RATE * 0.5 * (1 + math.cos(math.pi * epoch / epochs))
        frozen = epoch < start
        net.train()
        permutation = torch.randperm(len(x), generator=order)
        for first in range(0, len(x), BATCH):
            batch = permutation[first:first + BATCH]
            loss = nn.functional.cross_entropy(net(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            if frozen:
                for parameter in branch:
                    parameter.grad = None
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
    if name in BRANCHES:
        return f"{name} {start}" + (" bn" if norm == "batch" else ""), seed, accuracy
    return f"late {start}" if name == "late" else name, seed, accuracy


def main(argv: Sequence[str] | None = None) -> None:
    parser = BenchmarkParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=count, default=5)
    parser.add_argument("--epochs", type=count, default=EPOCHS, help=f"training epochs (default {EPOCHS})")
    parser.add_argument("--expansion", type=count, default=4)
    parser.add_argument("--late", type=whole_numbers(1), default="6,12",
                        help="epochs at which the new channels start learning")
    parser.add_argument("--branches", default="", help=f"branch sites to train too: some of {', '.join(BRANCHES)}")
    parser.add_argument("--branch-epoch", type=int, default=6, help="epoch at which the branches start learning")
    parser.add_argument("--branch-norm", choices=("group", "batch"), default="group")
    parser.add_argument("--no-wide", action="store_true", help="leave out the wide network from scratch")
    parser.add_argument("--host-init", action="store_true",
                        help="also the host with its second convolutions initialised as in the wide blocks")
    parser.add_argument("--jobs", type=count, default=2, help="worker processes, one torch thread each")
    args = parser.parse_args(argv)
    starts = args.late
    epochs = args.epochs
    if any(epoch >= epochs for epoch in [*starts, args.branch_epoch]) or args.branch_epoch < 1:
        parser.error(f"--late and --branch-epoch: epochs from 1 to {epochs - 1} (training is {epochs} epochs)")
    sites = [site.strip() for site in args.branches.split(",") if site.strip()]
    if any(site not in BRANCHES for site in sites):
        parser.error(f"--branches: choose among {', '.join(BRANCHES)}")
    variants = [("host", 0), *([("host init", 0)] if args.host_init else []),
                *([] if args.no_wide else [("wide", 0)]), *(("late", start) for start in starts),
                *((site, args.branch_epoch) for site in sites)]
    jobs = [(name, seed, args.expansion, start, args.branch_norm, epochs) for name, start in variants
            for seed in range(args.seeds)]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(train, jobs))
    host = {seed: accuracy for name, seed, accuracy in results if name == "host"}
    print(f"ResNet-20 width {HOST_WIDTH}, inner width x{args.expansion}, plain loop, {epochs} epochs, "
          f"{args.seeds} seeds")
    for label in dict.fromkeys(name for name, _, _ in results):
        accuracies = {seed: accuracy for name, seed, accuracy in results if name == label}
        line = f"  {label:10}{format_mean_std(list(accuracies.values()), '>8.2f')}%"
        if label != "host" and len(accuracies) >= 2:
            gains = [accuracy - host[seed] for seed, accuracy in accuracies.items()]
            line += f"   - host, paired by seed: {format_mean_error(gains)} points"
        print(line)


if __name__ == "__main__":
    run_script(main)
