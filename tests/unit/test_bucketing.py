"""Bucket assignment: reverse order, caps, the small first bucket, dtype separation, bad caps."""
import pytest
import torch

from ddp_core.bucketing import MB, TensorSpec, assign_buckets


def specs(*sizes_mb, key="f32"):
    return [TensorSpec(int(s * MB), key) for s in sizes_mb]


def test_reverse_order_fills_buckets_up_to_the_cap():
    sizes = specs(1, 1, 1, 1, 1)
    assert assign_buckets(sizes, [4, 3, 2, 1, 0], bucket_cap_mb=2) == [[4, 3], [2, 1], [0]]


def test_cap_zero_gives_one_tensor_per_bucket():
    sizes = specs(0.001, 0.001, 0.001)
    assert assign_buckets(sizes, [2, 1, 0], bucket_cap_mb=0, first_bucket_cap_mb=1) == [[2], [1], [0]]


def test_the_tensor_that_reaches_the_cap_closes_its_bucket_as_in_pytorch():
    assert assign_buckets(specs(1, 5, 1), [2, 1, 0], bucket_cap_mb=2) == [[2, 1], [0]]


@pytest.mark.parametrize("seed", range(20))
def test_buckets_are_pytorchs(seed):
    """The same assignment as PyTorch's own (C++) one, for random sizes, dtypes, orders and caps."""
    import random

    import torch.distributed as dist

    rng = random.Random(seed)
    dtypes = [torch.float32, torch.float16]
    tensors = [torch.empty(rng.choice([1, 7, 100, 3000, 70_000, 300_000]), dtype=rng.choice(dtypes))
               for _ in range(rng.randint(1, 30))]
    order = list(range(len(tensors)))
    rng.shuffle(order)
    cap_mb, first_mb = rng.choice([0.001, 0.01, 0.1, 0.5, 25]), rng.choice([0.005, 0.05, 1])
    limits = [min(int(first_mb * MB), int(cap_mb * MB)), int(cap_mb * MB)]
    theirs, _ = dist._compute_bucket_assignment_by_size([tensors[i] for i in order], limits)
    mine = assign_buckets([TensorSpec(t.numel() * t.element_size(), t.dtype) for t in tensors], order,
                          bucket_cap_mb=cap_mb, first_bucket_cap_mb=first_mb)
    assert mine == [[order[position] for position in bucket] for bucket in theirs]


def test_first_bucket_uses_its_own_smaller_cap():
    sizes = specs(*[0.5] * 8)
    buckets = assign_buckets(sizes, list(reversed(range(8))), bucket_cap_mb=2, first_bucket_cap_mb=1)
    assert buckets == [[7, 6], [5, 4, 3, 2], [1, 0]]


def test_dtypes_never_share_a_bucket_and_order_follows_first_tensor():
    sizes = [TensorSpec(MB // 2, torch.float32), TensorSpec(MB // 2, torch.float16), TensorSpec(MB // 2, torch.float32)]
    buckets = assign_buckets(sizes, [2, 1, 0], bucket_cap_mb=25)
    assert buckets == [[2, 0], [1]]


@pytest.mark.parametrize("cap, first", [(-1, 1), (25, -0.5)])
def test_negative_caps_are_rejected_with_the_value(cap, first):
    with pytest.raises(ValueError, match=r"-"):
        assign_buckets(specs(1), [0], bucket_cap_mb=cap, first_bucket_cap_mb=first)


def test_order_must_be_a_permutation():
    with pytest.raises(ValueError, match="permutation"):
        assign_buckets(specs(1, 1), [0, 0], bucket_cap_mb=25)
