"""Run by test_train_distributed.py under torchrun (two gloo ranks): checks every collective of
bonkernels.train.distributed.Dist against values each rank can compute alone, then that close()
finds the backend holding none of the tensors it was given."""

import warnings

import torch

from bonkernels.train.distributed import Dist


def main():
    warnings.simplefilter("error", RuntimeWarning)  # close() warns if tensors are still held
    d = Dist("cpu")
    assert d.enabled and d.world == 2

    # objects of different sizes on each rank (the padded gather must cut each one back)
    objs = [{"rank": 0, "x": [1.5]}, list(range(3000))]
    assert d.all_gather_objects(objs[d.rank]) == objs
    assert d.all_gather_objects(None) == [None, None]

    assert d.mean(float(d.rank + 1)) == 1.5

    torch.manual_seed(100 + d.rank)  # different weights and buffers on each rank
    module = torch.nn.Linear(3, 2)
    module.register_buffer("steps", torch.tensor([7 + d.rank], dtype=torch.int64))
    module.register_buffer("mask", torch.tensor([d.rank == 0, True]))
    torch.manual_seed(100)
    expected = torch.nn.Linear(3, 2)
    d.broadcast_module(module)
    assert torch.equal(module.weight, expected.weight) and torch.equal(module.bias, expected.bias)
    assert module.steps.tolist() == [7] and module.mask.tolist() == [True, True]

    params = list(module.parameters())
    module.weight.grad = torch.full_like(module.weight, float(d.rank))  # bias.grad stays None
    d.average_gradients(params)
    assert torch.equal(module.weight.grad, torch.full_like(module.weight, 0.5))
    assert torch.equal(module.bias.grad, torch.zeros_like(module.bias))

    d.close()
    assert d.pending_handoffs() == 0
    print(f"rank {d.rank}: collectives ok", flush=True)


if __name__ == "__main__":
    main()
