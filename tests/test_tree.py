"""bincheck.tree: flat tuples and lists take a shortcut in flatten/unflatten; it must give
exactly what the recursive walk gives, for every container the walk knows and the ones it
treats as leaves (subclasses of list and dict, tuples without fields)."""

import collections

import pytest

from bincheck.tree import LEAF, _build, _flatten, conform, describe, flatten, unflatten

NT = collections.namedtuple("NT", "a b")


class Sub(list):
    pass


class Dsub(dict):
    pass


class Plain(tuple):
    pass


CASES = [(1, 2), [1, 2], (), [], (1,), (1, None), (None,), (1, (2, 3)), ([1], 2), ({"a": 1}, 2),
         NT(1, 2), (NT(1, 2), 3), (Sub([1]), 2), (Dsub(a=1), 2), (Plain((1, 2)), 3), ((), 1),
         5, None, {"a": (1, 2)}, [[1, 2], [3]], ("s", b"b", 1.5)]


def walked(tree):
    leaves = []
    return leaves, _flatten(tree, leaves)


@pytest.mark.parametrize("tree", CASES, ids=repr)
def test_flatten_equals_the_recursive_walk_and_round_trips(tree):
    leaves, treedef = flatten(tree)
    assert (leaves, treedef) == walked(tree)
    assert type(leaves) is list
    back = unflatten(treedef, leaves)
    assert back == tree and type(back) is type(tree)
    assert back == _build(treedef, iter(leaves))


def test_a_flat_tuple_s_treedef_is_the_walk_s():
    assert flatten((7, 8))[1] == (tuple, None, (LEAF, LEAF))
    assert unflatten((list, None, (LEAF, LEAF)), ["a", "b"]) == ["a", "b"]


def test_ordered_and_default_dicts_are_containers_rebuilt_as_themselves():
    """OrderedDict and defaultdict (its default_factory kept) flatten into their values, as
    JAX's pytrees have them; two defaultdicts with other factories are other structures."""
    tree = {"x": collections.OrderedDict(b=1, a=(2, 3)),
            "y": collections.defaultdict(list, c=4)}
    leaves, treedef = flatten(tree)
    assert leaves == [1, 2, 3, 4]
    back = unflatten(treedef, leaves)
    assert back == tree and type(back["x"]) is collections.OrderedDict
    assert type(back["y"]) is collections.defaultdict and back["y"].default_factory is list
    assert flatten(collections.defaultdict(list, c=4))[1] != \
        flatten(collections.defaultdict(float, c=4))[1]
    assert describe(treedef) == "{'x': OrderedDict({'b': leaf, 'a': (leaf, leaf)}), " \
                                "'y': defaultdict(list)({'c': leaf})}"
    assert conform(collections.OrderedDict(a=(5, 6), b=7), treedef[2][0]) == \
        collections.OrderedDict(b=7, a=(5, 6))
