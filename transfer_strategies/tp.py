"""Tensor parallelism: which KV heads each worker of an engine holds, and which prefill worker
sends which of them to which decode worker.

vLLM's rule, which we follow (its QKVParallelLinear shards the KV heads; its NIXL connector's TP
topology, `TpKVTopology` in nixl/, maps them between engines the same way): with n KV heads and
tensor-parallel degree t, t must divide n or n divide t. When t <= n, rank r holds the n / t
heads [r * n/t, (r + 1) * n/t); when t > n each head is replicated on t / n ranks, rank r holding
head r // (t / n).

A decode worker takes each of its heads from one prefill worker that holds it: from one prefill
worker when decode's degree is higher (each decode worker has fewer heads), assembling them
from several when prefill's is higher. Where prefill replicates a head, decode worker q takes
it from replica q mod replicas, spreading the readers. A `Share` is what one prefill worker
sends one decode worker: a consecutive range of global heads. Both sides compute the same
shares from (p, d, n), so a channel's two ends agree without asking.

MLA's latent is one "head" here (base.engine_placement: vLLM counts 1), which every worker holds
whole: it crosses once, whatever the degrees. Prefill worker 0 sends it to decode worker 0 and the
other prefill workers send nothing; decode worker 0 relays each message to the engine's other
workers as it arrives (relay.py), over channels of their own on its host.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from transfer_strategies.transport.rendezvous import SCHEME, address


def degree_problem(tp: int, n_heads: int) -> str | None:
    """Why a TP degree cannot serve a model with n_heads KV heads (None: it can)."""
    if tp < 1:
        return f"tensor_parallel_size must be >= 1, got {tp}"
    if n_heads % tp and tp % n_heads:
        return (f"tensor_parallel_size={tp} does not divide the model's {n_heads} KV heads, nor do they divide it "
                f"(vLLM shards or replicates whole heads)")
    return None


def heads_of(rank: int, tp: int, n_heads: int) -> range:
    """The global KV heads worker `rank` of a TP group of `tp` holds (vLLM's sharding)."""
    if tp <= n_heads:
        per = n_heads // tp
        return range(rank * per, (rank + 1) * per)
    h = rank // (tp // n_heads)
    return range(h, h + 1)


@dataclass(frozen=True)
class Share:
    prefill_rank: int
    decode_rank: int
    heads: range  # global KV heads, consecutive


def shares(p: int, d: int, n_heads: int) -> list[Share]:
    """Every (prefill worker, decode worker, heads) of a p -> d transfer, by decode rank then head.
    One head (MLA's latent), held whole by every worker: one share, the other decode workers
    take it from decode worker 0 (Placement.relays)."""
    if n_heads == 1:
        return [Share(0, 0, range(0, 1))]
    out: list[Share] = []
    for q in range(d):
        for h in heads_of(q, d, n_heads):
            holders = [r for r in range(p) if h in heads_of(r, p, n_heads)]
            r = holders[q % len(holders)]
            last = out[-1] if out else None
            if last is not None and last.decode_rank == q and last.prefill_rank == r and last.heads.stop == h:
                out[-1] = Share(r, q, range(last.heads.start, h + 1))
            else:
                out.append(Share(r, q, range(h, h + 1)))
    return out


@dataclass(frozen=True)
class Placement:
    """One worker's place in a p -> d transfer of a model with n_heads KV heads."""

    rank: int
    prefill_tp: int
    decode_tp: int
    n_heads: int
    is_producer: bool

    @property
    def tp(self) -> int:
        return self.prefill_tp if self.is_producer else self.decode_tp

    @property
    def heads(self) -> range:
        return heads_of(self.rank, self.tp, self.n_heads)

    @property
    def one_head(self) -> bool:
        """The model has one KV head (MLA's latent), whole on every worker: nothing is cut or joined."""
        return self.n_heads == 1

    @property
    def relays(self) -> bool:
        """A decode worker of an engine of several, each holding the one head whole: worker 0
        takes it over the link and relays it to the others (relay.py)."""
        return self.one_head and not self.is_producer and self.decode_tp > 1

    @property
    def single(self) -> bool:
        """One worker on each side: the layout every strategy had before TP."""
        return self.prefill_tp == 1 and self.decode_tp == 1

    def my_shares(self) -> list[Share]:
        """A prefill worker's shares (the decode workers it sends to), or a decode worker's (the
        prefill workers it takes its heads from), in order of heads."""
        return [s for s in shares(self.prefill_tp, self.decode_tp, self.n_heads)
                if (s.prefill_rank if self.is_producer else s.decode_rank) == self.rank]

    def slot(self, share: Share) -> tuple[int, int]:
        """(position of the share among its decode worker's shares, how many it has): a decode
        worker fed by several prefill workers numbers their messages apart by it."""
        every = shares(self.prefill_tp, self.decode_tp, self.n_heads)
        theirs = [s for s in every if s.decode_rank == share.decode_rank]
        return theirs.index(share), len(theirs)

    def rendezvous(self, base: str, share: Share) -> str:
        """One rendezvous file per (prefill worker, decode worker) channel; the one file of
        before when both engines have one worker."""
        if self.single:
            return base
        fixed = address(base)
        if fixed is not None:  # an address: a port per channel, counted up from the one given
            return f"{SCHEME}{fixed[0]}:{fixed[1] + share.prefill_rank * self.decode_tp + share.decode_rank}"
        return f"{base}.p{share.prefill_rank}d{share.decode_rank}"

    def relay_rendezvous(self, base: str, decode_rank: int) -> str:
        """The rendezvous file of decode worker 0's relay to decode worker `decode_rank` (a file
        on this host even where the link's is an address: both workers are here)."""
        fixed = address(base)
        if fixed is not None:
            return str(Path(tempfile.gettempdir()) / f"kv-relay-{fixed[1]}.d{decode_rank}")
        return f"{base}.relay{decode_rank}"
