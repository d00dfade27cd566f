"""Draft trees: a request's candidate continuations merged into a token trie, and the part of it
one step verifies, laid out as chains (scheduler process).

Several earlier occurrences of a request's suffix often continue differently ("Hana" followed
once by " Sato-Brown" and once by " works as"): merged into a trie rooted at the request's last
token, they share their common prefixes, and verification follows whichever branch the model
agrees with. A step verifies the nodes `policy.select_nodes` picked, decomposed into chains: the
first chain (the most probable path) runs as the request's own extend, every other chain as a
pseudo-request in a spare `req_to_token` row whose prefix is its parent chain's row, so every
attention backend runs the tree unchanged (each chain's rows attend to their ancestors only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .ngram import Candidate, continuation
from .policy import AcceptanceModel, RequestAcceptance

if TYPE_CHECKING:
    from radixgen.runtime.constrained.base_grammar_backend import BaseGrammarObject

ROOT = 0


@dataclass
class CandidateTree:
    """The trie of a request's candidate continuations. Node 0 is the root (the request's last
    token, already in its sequence); every other node is a draft token with the probability that
    verification reaches and accepts it (`prob`, the product along its path)."""

    tokens: list[int] = field(default_factory=lambda: [-1])
    parents: list[int] = field(default_factory=lambda: [-1])
    depths: list[int] = field(default_factory=lambda: [0])
    match: list[int] = field(default_factory=lambda: [0])  # the best match proposing it
    weight: list[float] = field(default_factory=lambda: [0.0])  # its candidates' weight
    share: list[float] = field(default_factory=lambda: [1.0])  # weight / parent's weight
    prob: list[float] = field(default_factory=lambda: [1.0])
    children: list[dict[int, int]] = field(default_factory=lambda: [{}])

    @classmethod
    def build(
        cls,
        tokens: list[int],
        candidates: list[Candidate],
        depth: int,
        model: AcceptanceModel,
        req: RequestAcceptance,
    ) -> CandidateTree:
        """The trie of the candidates' continuations, `depth` tokens each at most."""
        tree = cls()
        for cand in candidates:
            w = model.first_weight(cand.match)
            tree.weight[ROOT] += w
            u = ROOT
            follow = cand.follow
            for tok in (
                follow[:depth] if follow is not None else continuation(tokens, cand.start, depth)
            ):
                v = tree.children[u].get(tok)
                if v is None:
                    v = tree._add(u, tok, cand.match)
                tree.weight[v] += w
                u = v
        for v in range(1, len(tree.tokens)):  # parents precede children
            u = tree.parents[v]
            tree.share[v] = tree.weight[v] / tree.weight[u]
            p = model.prob(tree.depths[v], tree.match[v], tree.share[v], req)
            tree.prob[v] = tree.prob[u] * p
        return tree

    def _add(self, parent: int, tok: int, match: int) -> int:
        v = len(self.tokens)
        self.tokens.append(tok)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.match.append(match)
        self.weight.append(0.0)
        self.share.append(1.0)
        self.prob.append(0.0)
        self.children.append({})
        self.children[parent][tok] = v
        return v

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class StepDraft:
    """The nodes of a request's tree that this step verifies, renumbered so that each chain's
    nodes are consecutive (chain 0 first): node 0 is the root, `chains[0]` the request's own
    draft tokens, `chains[1:]` the branches. Per node: token, parent, depth, and what the
    acceptance model learns from (`match`, `share`); `mask` holds a constrained request's grammar
    bitmask row per node (the tokens allowed after it). The scheduler fills `slots` (KV slot per
    node) and `branch_rows` (the request rows of chains[1:]) when the step runs."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    match: list[int]
    share: list[float]
    chains: list[list[int]]
    mask: torch.Tensor | None = None
    slots: list[int] = field(default_factory=list)
    branch_rows: list[int] = field(default_factory=list)

    @property
    def main(self) -> list[int]:
        """The tokens of chain 0: the request's own extend after its last token."""
        return [self.tokens[v] for v in self.chains[0]] if self.chains else []

    @property
    def branch_tokens(self) -> int:
        return sum(len(c) for c in self.chains[1:])

    def __len__(self) -> int:
        """Draft tokens (nodes besides the root)."""
        return len(self.tokens) - 1

    def walk(self, choices: list[int]) -> list[int]:
        """The accepted path (node ids, root excluded) given the token chosen at every node:
        from the root, follow the child whose token is the choice while there is one."""
        children: dict[tuple[int, int], int] = {
            (self.parents[v], self.tokens[v]): v for v in range(1, len(self.tokens))
        }
        path: list[int] = []
        u = ROOT
        while (v := children.get((u, choices[u]))) is not None:
            path.append(v)
            u = v
        return path


def step_draft(tree: CandidateTree, keep: list[bool], mask: torch.Tensor | None) -> StepDraft:
    """The kept nodes of `tree` (a kept node's parent is kept) as chains: each chain follows the
    most probable kept child down from its first node; a node's other kept children start
    further chains, the most probable first, so chain 0 is the most probable path and a chain's
    parent chain always precedes it. `mask`: the grammar's rows per tree node, reordered with
    the nodes."""
    chains: list[list[int]] = []
    queue = [ROOT]  # nodes whose kept children still need chains, in chain order
    i = 0
    while i < len(queue):
        u = queue[i]
        i += 1
        kids = [c for c in tree.children[u].values() if keep[c]]
        if u != ROOT and kids:
            kids.remove(max(kids, key=lambda c: tree.prob[c]))  # u's own chain goes on there
        for c in sorted(kids, key=lambda c: -tree.prob[c]):
            path = [c]
            while grand := [g for g in tree.children[path[-1]].values() if keep[g]]:
                path.append(max(grand, key=lambda g: tree.prob[g]))
            chains.append(path)
            queue.extend(path)
    order = [ROOT] + [v for chain in chains for v in chain]
    new_id = {old: i for i, old in enumerate(order)}
    return StepDraft(
        tokens=[tree.tokens[v] for v in order],
        parents=[-1] + [new_id[tree.parents[v]] for v in order[1:]],
        depths=[tree.depths[v] for v in order],
        match=[tree.match[v] for v in order],
        share=[tree.share[v] for v in order],
        chains=[[new_id[v] for v in chain] for chain in chains],
        mask=None if mask is None else mask[order],
    )


def walk_grammar(
    grammar: BaseGrammarObject, tree: CandidateTree, keep: list[bool], words: int
) -> torch.Tensor:
    """Cut the kept nodes at the grammar: a node stays kept only if the grammar accepts the path
    to it (`keep` is updated in place; a cut node's subtree goes with it), and a node that ends
    the grammar keeps no children. Returns the grammar's bitmask row per tree node (the tokens
    allowed after it: every kept node's logits row is read under it). The matcher ends where it
    started."""
    mask = torch.full((len(tree), words), -1, dtype=torch.int32)

    def visit(u: int) -> None:
        grammar.fill_next_token_bitmask(mask, u)
        for v in list(tree.children[u].values()):
            if not keep[v]:
                continue
            tok = tree.tokens[v]
            allowed = (int(mask[u, tok >> 5]) >> (tok & 31)) & 1
            if not allowed or not grammar.accept_token(tok):
                _drop(tree, keep, v)
                continue
            try:
                if grammar.is_terminated():  # the request ends with this token
                    for c in tree.children[v].values():
                        _drop(tree, keep, c)
                else:
                    visit(v)
            finally:
                grammar.rollback(1)

    visit(ROOT)
    return mask


def _drop(tree: CandidateTree, keep: list[bool], v: int) -> None:
    stack = [v]
    while stack:
        u = stack.pop()
        if keep[u]:
            keep[u] = False
            stack.extend(tree.children[u].values())
