"""Batches from memory (batches.py): sharded over ranks without overlap, reshuffled each epoch,
resumable mid-epoch, exactly the batches the plain way of writing it gives."""

import pytest
import torch

from mnistlab.runtime.data.in_memory import PAD_LABEL, InMemoryLoader, ShardedOrder
from mnistlab.runtime.run.failures import InputError


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shards_partition_each_global_batch(world_size: int) -> None:
    num_samples, batch_size = 1_000, 12  # 1,000 = 83 full batches + 4
    single = ShardedOrder(num_samples, batch_size, shuffle=True, seed=7).indices()
    shards = [
        ShardedOrder(num_samples, batch_size, r, world_size, shuffle=True, seed=7).indices() for r in range(world_size)
    ]
    assert all(s.shape == (84, batch_size // world_size) for s in shards)
    for step in range(len(single)):
        together = torch.cat([s[step] for s in shards])
        assert sorted(together.tolist()) == sorted(single[step].tolist())
    seen = torch.cat([s.flatten() for s in shards])
    seen = seen[seen >= 0]
    assert sorted(seen.tolist()) == list(range(num_samples))  # each sample once, on one rank
    padding = [int((s[-1] < 0).sum()) for s in shards]
    assert sum(padding) == 84 * batch_size - num_samples and max(padding) - min(padding) <= 1


def test_each_epoch_reshuffles_reproducibly() -> None:
    order = ShardedOrder(100, 10, shuffle=True, seed=3)
    first = order.indices()
    order.set_epoch(1)
    second = order.indices()
    assert not torch.equal(first, second)
    assert sorted(first.flatten().tolist()) == sorted(second.flatten().tolist())
    order.set_epoch(0)
    assert torch.equal(order.indices(), first)


def test_loader_resumes_mid_epoch_at_the_same_batch() -> None:
    def loader() -> InMemoryLoader:
        order = ShardedOrder(100, 10, rank=1, world_size=2, shuffle=True, seed=5)
        return InMemoryLoader(torch.arange(100).float(), torch.arange(100), order)

    uninterrupted = loader()
    uninterrupted.sampler.set_epoch(2)
    expected = [y for _, y in uninterrupted]
    interrupted = loader()
    interrupted.sampler.set_epoch(2)
    batches = iter(interrupted)
    for _ in range(4):
        next(batches)
    resumed = loader()
    resumed.load_state_dict(interrupted.state_dict())
    resumed.sampler.set_epoch(2)  # Lightning sets the epoch again before iterating
    rest = [y for _, y in resumed]
    assert len(rest) == 6 and all(torch.equal(a, b) for a, b in zip(rest, expected[4:]))


def test_batch_size_must_divide_by_the_world_size() -> None:
    with pytest.raises(InputError, match="data.batch_size=64 .* world size 3"):
        ShardedOrder(1_000, 64, rank=0, world_size=3)


def _reference_batches(num_samples: int, batch_size: int, rank: int, world_size: int, seed: int, epoch: int):
    """The batches written the plain way: shuffle, cut into global batches, deal each out by rank."""
    order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    for start in range(0, num_samples, batch_size):
        yield order[start : start + batch_size][rank::world_size]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_loader_serves_the_reference_batches(world_size: int) -> None:
    num_samples, batch_size, seed = 1_003, 16, 11
    for rank in range(world_size):
        order = ShardedOrder(num_samples, batch_size, rank, world_size, shuffle=True, seed=seed)
        loader = InMemoryLoader(torch.zeros(num_samples, 2), torch.arange(num_samples), order)
        for epoch in (0, 1):
            loader.sampler.set_epoch(epoch)
            served = [y[y != PAD_LABEL].tolist() for _, y in loader]
            assert served == list(_reference_batches(num_samples, batch_size, rank, world_size, seed, epoch))
