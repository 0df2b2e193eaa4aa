"""Which serving pool a reported replica is in, decided by what the control plane declares, never
by what the node says (docs/security.md "Serving pools and the capacity guard").

A node's collector reports its engines: engine, port, model, the GPUs each uses and, from its own
settings, `pool=NAME`. All of it is the node's word. The policy's `[serving.pools.NAME]` tables
are the aggregator's: each names a pool's cluster, the nodes that may serve it (name patterns,
fnmatch: `gpu-east-*`, `node-0[1-4]`) and the models its replicas serve (default: the pool's
name, so `[serving.pools."meta-llama/Llama-3.1-70B-Instruct"]` is the pool of that model). A
replica counts in a pool's figures only when

- its node matches one of the pool's node patterns, and the pool it claims (`pool=`) is that
  pool, or it claims none and its model is one of the pool's models (the first such pool, by
  name, when several would take it);
- its names pass the one grammar (protos/names.py), and
- its node is within its bounds: no more replicas than the GPUs it declared at its Hello, and
  no GPU in two replicas.

The pool's cluster is the placement's, so a node's Hello cannot move a replica to another
cluster's pool. Every other replica is *unverified*: kept aside with why, shown by `gpufleet
pools` and counted on /metrics, never in a pool's size, mean or projection. With no pool
declared, no replica is verified and no drain waits for capacity: serving-aware repair is
something an operator turns on by saying which nodes serve what.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufleet.protos.credentials import node_name_problem
from gpufleet.protos.names import UNKNOWN_ENGINE_MODEL, serving_name_problem
from gpufleet.repair.serving import ReplicaReading

# Why a replica is unverified, as a bounded word (the /metrics label, `gpufleet pools`).
REFUSAL_KINDS = ("bad_name", "not_declared", "not_placed", "over_gpus", "shared_gpu")
MAX_NODE_PATTERNS = 256  # per declared pool
MAX_DECLARED_POOLS = 1024
MAX_PATTERN_LEN = 253


@dataclass(frozen=True)
class PoolPlacement:
    """One `[serving.pools.NAME]` table: which nodes may serve the pool, and which models."""

    name: str
    cluster: str
    nodes: tuple[str, ...]  # fnmatch patterns over node names
    models: tuple[str, ...] = ()  # () : the pool's name is its model

    def takes(self, node: str, claimed_pool: str, model: str) -> bool:
        if claimed_pool:
            if claimed_pool != self.name:
                return False
        elif model not in (self.models or (self.name,)):
            return False
        return any(fnmatch.fnmatchcase(node, pattern) for pattern in self.nodes)


@dataclass(frozen=True)
class Placement:
    """Every declared pool, by name (the policy's `[serving.pools]`)."""

    pools: tuple[PoolPlacement, ...] = ()

    def pool_for(self, node: str, claimed_pool: str, model: str) -> PoolPlacement | None:
        return next((p for p in self.pools if p.takes(node, claimed_pool, model)), None)

    def place(
        self, readings: Iterable[ReplicaReading], gpus_declared: Mapping[str, int]
    ) -> list[ReplicaReading]:
        """Each reading, in its declared pool (cluster and pool name the placement's), or with
        `unverified` saying why not. gpus_declared: each node's GPU count from its Hello."""
        out: list[ReplicaReading] = []
        by_node: dict[str, list[ReplicaReading]] = {}
        for r in readings:
            by_node.setdefault(r.node, []).append(r)
        for node, replicas in by_node.items():
            used: set[int] = set()
            verified = 0
            limit = gpus_declared.get(node, 0)
            for r in sorted(replicas, key=lambda x: (x.engine, x.port)):
                placed = self.pool_for(r.node, r.pool, r.model)
                kind, why = self._refusal(r, placed, used, verified, limit)
                if placed is None or why:
                    out.append(dataclasses.replace(r, unverified=why, unverified_kind=kind))
                    continue
                verified += 1
                used.update(r.gpu_indices)
                out.append(dataclasses.replace(r, cluster=placed.cluster, pool=placed.name))
        return out

    def _refusal(
        self, r: ReplicaReading, placed: PoolPlacement | None, used: set[int], verified: int, limit: int
    ) -> tuple[str, str]:
        """(kind, why) r is not counted in the pool `placed` (the one that takes it, if any);
        ("", ""): it is."""
        if r.pool and (why := serving_name_problem("pool", r.pool)):
            return "bad_name", why
        if r.model != UNKNOWN_ENGINE_MODEL and (why := serving_name_problem("model", r.model)):
            return "bad_name", why
        if placed is None:
            if not self.pools:
                return "not_declared", "no serving pool is declared (the policy's [serving.pools])"
            return "not_placed", f"no declared pool places {r.pool or r.model!r} on this node"
        if verified >= limit:
            return "over_gpus", f"more replicas than the {limit} GPUs the node declared"
        shared = sorted(used.intersection(r.gpu_indices))
        if shared:
            return "shared_gpu", f"GPU {shared[0]} is already another replica's"
        return "", ""


def placement_from_table(table: Mapping[str, object], source: str) -> Placement:
    """`[serving.pools]` -> Placement; ValueError naming the table, the key and what to give."""
    if not isinstance(table, Mapping):
        raise ValueError(f"{source}: [serving.pools] must be a table of pools, [serving.pools.NAME]")
    if len(table) > MAX_DECLARED_POOLS:
        raise ValueError(
            f"{source}: [serving.pools] declares {len(table)} pools; at most {MAX_DECLARED_POOLS}"
        )
    pools = []
    for name in sorted(table):
        where = f"{source}: [serving.pools.{name}]"
        # A pool is named as its collectors' pool= names it, or by the model it serves.
        if serving_name_problem("pool", name) and (why := serving_name_problem("model", name)):
            raise ValueError(f"{where}: the name is neither a pool name nor a model name: {why}")
        entry = table[name]
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where} must be a table with cluster, nodes and (optional) models")
        unknown = set(entry) - {"cluster", "nodes", "models"}
        if unknown:
            raise ValueError(
                f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: cluster, nodes, models"
            )
        cluster = entry.get("cluster")
        if not isinstance(cluster, str) or (why := node_name_problem(cluster)):
            raise ValueError(f"{where}: cluster = {cluster!r} must be a cluster name ({why or 'text'})")
        nodes = entry.get("nodes")
        if (
            not isinstance(nodes, list)
            or not nodes
            or len(nodes) > MAX_NODE_PATTERNS
            or not all(isinstance(p, str) and 0 < len(p) <= MAX_PATTERN_LEN for p in nodes)
        ):
            raise ValueError(
                f"{where}: nodes = {nodes!r} must be a list of 1 to {MAX_NODE_PATTERNS} node names or "
                "patterns (fnmatch: '*', '?', '[0-9]'), e.g. [\"gpu-east-*\"]"
            )
        models = entry.get("models", [])
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise ValueError(f"{where}: models = {models!r} must be a list of model names")
        for model in models:
            if why := serving_name_problem("model", model):
                raise ValueError(f"{where}: models: {why}")
        pools.append(PoolPlacement(name, cluster, tuple(nodes), tuple(models)))
    return Placement(tuple(pools))
