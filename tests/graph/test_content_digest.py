"""``content_digest``: the key of compiled programs for plans (``Plan.signature``) and closed-over data."""

import numpyro.distributions as dist

from blrppl.graph.data import content_digest


class _Box:
    def __init__(self, value):
        self.value = value


def test_the_digest_of_objects_is_the_same_at_every_call():
    # Each object's attributes were digested as a temporary dict whose id, once freed, the next
    # temporary reused: ``seen`` then skipped it as a cycle, and the digest depended on memory.
    boxes = [_Box(1), _Box(2)]
    assert len({content_digest(boxes) for _ in range(5)}) == 1
    transforms = [dist.transforms.AffineTransform(0.0, 2.0), dist.transforms.AffineTransform(1.0, 3.0)]
    assert len({content_digest(transforms) for _ in range(5)}) == 1


def test_objects_that_differ_in_any_attribute_have_different_digests():
    for other in ([_Box(1), _Box(3)], [_Box(0), _Box(2)], [_Box(1)], [_Box(1), _Box(2), _Box(2)]):
        assert content_digest([_Box(1), _Box(2)]) != content_digest(other)
    affine = dist.transforms.AffineTransform
    assert content_digest([affine(0.0, 2.0), affine(1.0, 3.0)]) != content_digest([affine(0.0, 2.0), affine(1.0, 4.0)])


def test_a_shared_object_and_a_cycle_are_digested_once():
    box = _Box(1)
    box.value = box  # a cycle
    assert len({content_digest([box, box]) for _ in range(3)}) == 1
