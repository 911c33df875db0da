"""Order conditions on nonlinear fields: one step as a B-series over coloured rooted trees.

A near-identity map of the start ``u`` is written ``u + Σ_t h^|t|/σ(t) a(t) F(t)(u)`` over
rooted trees ``t`` whose nodes are coloured by fields ``f_k`` (operator instances); ``F(t)``
is the elementary differential (``f_k`` at the root, its derivatives applied to the
children's differentials) and ``a`` the coefficients (Hairer–Lubich–Wanner, *Geometric
Numerical Integration*, III.1 and III.2: B-series, P-series of partitioned methods). Every
state a step computes is such a map, and three rules give its coefficients:

- ``h f_k(Y)`` for ``Y = B(y)`` has ``a([t_1 … t_m]_k) = y(t_1) ⋯ y(t_m)`` at a root coloured
  ``k``, 0 at other roots (HLW Lemma III.1.9); a summed field ``Σ α_k f_k`` weights by ``α_k``;
- weighted sums of states (parallel branches, stages) add coefficients;
- the exact flow of ``α f`` over one step from ``Y`` solves ``dz(t)/ds = α [root k] Π z(t_i)(s)``,
  ``z(0) = y``: polynomials in ``s`` by recursion on the size of ``t``, read at ``s = 1``.

The exact solution of ``u_t = Σ c_k f_k`` is the last rule from ``u`` (``a(t) = Π c / γ(t)``).
A step has order ``p`` when its coefficients equal the exact solution's on every tree with
at most ``p`` nodes. Fields that commute or are linear satisfy fewer conditions: the word
series of linear generators is the restriction to chains (trees with one child per node).

Colourings: all coloured trees of one size while they are few (``EXACT_TREES``), in exact
rational arithmetic; beyond, each uncoloured tree is checked once with a random weight per
node and field in place of the one-hot colours, which contracts all its colourings into
one polynomial identity in the weights, evaluated modulo the prime ``PRIME = 2^61 − 1``.
A failing condition is missed only when that polynomial (of degree ``n``, nonzero modulo
``PRIME``) vanishes at the random point: probability at most ``n / PRIME``
(Schwartz–Zippel); the seed is fixed, so the answer is reproducible. The work (node × state updates) is counted and bounded (``MAX_WORK``):
sizes past the bound are left undecided, never computed slowly.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import product

from splitformer.symbolic.tableaux import rooted_trees

__all__ = ["Node", "Forest", "Program", "coloured_tree_count", "MAX_NODES", "MAX_WORK", "EXACT_TREES", "PRIME"]

#: Trees are checked up to this many nodes: orders up to ``MAX_NODES - 1`` are decided.
MAX_NODES = 9
#: Sizes whose coloured trees number at most this are checked tree by tree.
EXACT_TREES = 250
#: The most node × state updates one analysis makes (about 10 µs each: some seconds of CPU, far below 1 GiB).
MAX_WORK = 1_000_000

Field = dict[str, Fraction]
#: A coloured tree: ``(colour, children)`` with the children sorted, or an uncoloured shape (tuple of shapes).
Coloured = tuple


@dataclass(frozen=True)
class Node:
    """A node of a tree in the forest: its children (earlier nodes), its weight for each field
    (one-hot for a coloured tree, random for a contraction of all colourings), its size."""

    children: tuple[int, ...]
    weights: dict[str, int]
    size: int
    label: Coloured
    #: Random weights (all colourings at once, modulo ``PRIME``) rather than one colour.
    contracted: bool = False

    def weight(self, of: Field):
        total = 0
        for colour, value in self.weights.items():
            if colour in of:
                total += of[colour] * value
        return total


def coloured_tree_count(nodes: int, colours: int) -> int:
    """Rooted trees with ``nodes`` nodes, each coloured by one of ``colours`` (2, 4, 14, 52, … for two)."""
    trees = [0, colours]  # trees[n]; forests by the Euler transform
    forests = [1]
    for n in range(1, nodes):
        divisor_sums = [sum(d * trees[d] for d in range(1, k + 1) if k % d == 0) for k in range(n + 1)]
        forests.append(sum(divisor_sums[k] * forests[n - k] for k in range(1, n + 1)) // n)
        trees.append(colours * forests[n])
    return trees[nodes]


def _colourings(shape: tuple, colours: tuple[str, ...], cache: dict) -> set[Coloured]:
    if shape not in cache:
        children = [sorted(_colourings(child, colours, cache)) for child in shape]
        cache[shape] = {(colour, tuple(sorted(combination))) for colour in colours for combination in product(*children)}
    return cache[shape]


@dataclass
class Forest:
    """The trees checked so far, children before parents; coloured trees are shared by their parents."""

    colours: tuple[str, ...]
    seed: int = 0
    nodes: list[Node] = field(default_factory=list)
    _index: dict[Coloured, int] = field(default_factory=dict)
    _shapes: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    def exact(self, size: int) -> bool:
        return coloured_tree_count(size, len(self.colours)) <= EXACT_TREES

    def new_nodes(self, size: int) -> int:
        """How many nodes ``add(size)`` appends at most."""
        if self.exact(size):
            return coloured_tree_count(size, len(self.colours))
        return size * len(rooted_trees(size))

    def coloured(self, tree: Coloured) -> int:
        """The node of a coloured tree (added with its subtrees when new)."""
        if tree not in self._index:
            colour, children = tree
            indices = tuple(self.coloured(child) for child in children)
            size = 1 + sum(self.nodes[i].size for i in indices)
            self.nodes.append(Node(indices, {colour: 1}, size, tree))
            self._index[tree] = len(self.nodes) - 1
        return self._index[tree]

    def _contracted(self, shape: tuple) -> int:
        children = tuple(self._contracted(child) for child in shape)
        weights = {colour: self._random.randrange(1, PRIME) for colour in self.colours}
        self.nodes.append(Node(children, weights, 1 + sum(self.nodes[i].size for i in children), shape, True))
        return len(self.nodes) - 1

    def add(self, size: int) -> list[int]:
        """The roots of the conditions on trees of ``size`` nodes (all coloured trees, or one
        contraction per uncoloured tree)."""
        if self.exact(size):
            trees = sorted(set().union(*(_colourings(shape, self.colours, self._shapes) for shape in rooted_trees(size))))
            return [self.coloured(tree) for tree in trees]
        return [self._contracted(shape) for shape in rooted_trees(size)]

    def chains(self, size: int) -> list[int]:
        """The coloured chains (one child per node) of ``size`` nodes: the words of linear generators."""
        chains = []
        for word in product(self.colours, repeat=size):
            tree: Coloured = (word[-1], ())
            for colour in reversed(word[:-1]):
                tree = (colour, (tree,))
            chains.append(self.coloured(tree))
        return chains


#: Contracted trees are evaluated modulo this prime (2^61 − 1).
PRIME = (1 << 61) - 1


def _modular(value: Fraction) -> int:
    return value.numerator * pow(value.denominator, -1, PRIME) % PRIME


def _scalars(of: Field) -> tuple[Field, dict[str, int]]:
    """A field's coefficients, exact and modulo ``PRIME``."""
    return of, {colour: _modular(Fraction(c)) for colour, c in of.items()}


def _integral(poly: list, modular: bool) -> list:
    """``∫_0^s`` of a polynomial in ``s`` (coefficients from the constant up)."""
    if modular:
        return [0] + [c * pow(power + 1, -1, PRIME) % PRIME for power, c in enumerate(poly)]
    return [0] + [Fraction(c) / (power + 1) for power, c in enumerate(poly)]


def _times(left: list, right: list, modular: bool) -> list:
    result = [0] * (len(left) + len(right) - 1)
    for i, a in enumerate(left):
        if a:
            for j, b in enumerate(right):
                if b:
                    result[i + j] += a * b
    return [c % PRIME for c in result] if modular else result


class Program:
    """States of one step as operations on earlier states; ``values`` their coefficients by node.

    State 0 is the start ``u`` (coefficient 0 on every tree). ``combine`` is a weighted sum,
    ``field`` is ``h f(Y)`` for a summed field, ``flow`` the exact flow of a field over one step.
    Coloured trees get exact rationals (zeros are the int 0, and skipped: most coefficients of
    a coloured tree vanish); contracted trees get residues modulo ``PRIME``.
    """

    def __init__(self) -> None:
        self.operations: list[tuple] = [("start",)]
        self.values: list[list] = [[]]
        self._polys: dict[int, list[list]] = {}
        #: The coefficient of ``u`` itself (the empty tree) in each state; 1 in a consistent step.
        self.constants = [Fraction(1)]
        self.consistent = True
        self.work = 0

    def cost(self, nodes: int, size: int) -> int:
        """An upper bound on the work ``evaluate`` does for ``nodes`` new nodes of at most ``size`` nodes."""
        return nodes * (len(self.operations) * size + len(self._polys) * size**2)

    def _new(self, operation: tuple) -> int:
        self.operations.append(operation)
        self.values.append([])
        return len(self.operations) - 1

    def combine(self, terms: Iterable[tuple[Fraction, int]]) -> int:
        terms = [(weight, state) for weight, state in terms if weight != 0]
        if len(terms) == 1 and terms[0][0] == 1:
            return terms[0][1]
        self.constants.append(sum((weight * self.constants[state] for weight, state in terms), Fraction(0)))
        return self._new(("combine", (tuple(terms), tuple((_modular(w), state) for w, state in terms))))

    def field(self, state: int, of: Field) -> int:
        self.consistent &= self.constants[state] == 1  # the lemma expands f around u itself
        self.constants.append(Fraction(0))
        return self._new(("field", state, _scalars(of)))

    def flow(self, state: int, of: Field) -> int:
        self.consistent &= self.constants[state] == 1
        self.constants.append(self.constants[state])
        self._polys[len(self.operations)] = []
        return self._new(("flow", state, _scalars(of)))

    def evaluate(self, nodes: list[Node]) -> None:
        """Coefficients of every state on the nodes not yet evaluated."""
        for index in range(len(self.values[0]), len(nodes)):
            node = nodes[index]
            modular = node.contracted
            self.work += len(self.operations) * (1 + len(node.children))
            for state, operation in enumerate(self.operations):
                kind = operation[0]
                if kind == "start":
                    value = 0
                elif kind == "combine":
                    value = 0
                    for weight, source in operation[1][modular]:
                        term = self.values[source][index]
                        if term:
                            value += weight * term
                elif kind == "field":
                    value = node.weight(operation[2][modular])
                    source = self.values[operation[1]]
                    for child in node.children:
                        if not value:
                            break
                        value *= source[child]
                else:
                    value = self._flow(state, operation, node, index)
                self.values[state].append(value % PRIME if modular else value)

    def _flow(self, state: int, operation: tuple, node: Node, index: int):
        modular = node.contracted
        polys, start = self._polys[state], self.values[operation[1]][index]
        derivative = [node.weight(operation[2][modular])]
        for child in node.children:
            if len(derivative) == 1 and not derivative[0]:
                break
            derivative = _times(derivative, polys[child], modular)
        if len(derivative) == 1 and not derivative[0]:
            polys.append([start])
            return start
        self.work += len(node.children) * node.size
        poly = _integral(derivative, modular)
        poly[0] += start
        polys.append(poly)
        return sum(poly)
