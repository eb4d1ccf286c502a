"""chunkwise: with chunked prefill (vLLM's default for long prompts: a prompt longer than the
step's token budget is computed over several steps), the blocks each step completes leave when
that step's forward pass ends, so after the step that computes the prompt's last token only its
last chunk is still to send. Between fused (one message, all after the last step) and layerwise
(one message per layer, from inside every forward pass) in messages and hooks: one message per
chunk, from `wait_for_save`, no per-layer hook. A prompt computed in one step is sent as fused
sends it.

Each message holds whole blocks of every layer, [first_block, end), its first block named in
the message's meta; the last one carries the number of messages (the earlier ones 0: how many
chunks a prompt takes is the scheduler's choice, step by step). The receiver scatters each
message at its first block. Needs one worker per engine or equal tensor-parallel degrees (a
decode worker joining heads from several prefill workers needs the count up front).

Not handled yet: a prefill request preempted mid-prompt recomputes its blocks, and those already
sent are not sent again (where the recomputation differs in its bits, as it may on a GPU, the
digests fail the transfer: not silent); one aborted mid-prompt leaves its earlier chunks with the
decode worker until the decode request's timeout (the count never comes).
"""

from dataclasses import dataclass, replace

from transfer_strategies.base import TransferConnector, TransferRequest
from transfer_strategies.scheduler import Progress


@dataclass
class _Sent:
    blocks: int = 0  # blocks [0, blocks) have left
    messages: int = 0
    bytes: int = 0


class ChunkwiseConnector(TransferConnector):
    moves_hybrid = False  # streams by layer or by chunk: a hybrid model's pages are neither (kv_groups.py)

    needs_equal_tp = True  # the harness refuses other degrees before any engine starts (harness/checks.py)

    def register_kv_caches(self, kv_caches):
        super().register_kv_caches(kv_caches)
        self._sent: dict[str, _Sent] = {}  # transfer id -> its earlier chunks (this worker's state across steps)

    # prefill side
    def wait_for_save(self) -> None:
        if self.has_connector_metadata():
            for req in self.this_step().chunks:  # the blocks this step completed, now
                self._send_chunk(req)
        super().wait_for_save()  # the step that ends a prompt: `send`

    def _send_chunk(self, req: TransferRequest) -> None:
        sent = self._sent.setdefault(req.transfer_id, _Sent())
        end = req.computed_tokens // self.block_size  # whole blocks only: the last one is still filling
        if end <= sent.blocks:
            return
        # a request of its own for this step's bookkeeping: the one vLLM hands the next step may be
        # this object again (one process) or a copy (several), and its clock and counts start there
        chunk = replace(req, progress=Progress())
        self.begin_send(chunk)
        self.post(chunk, self.gather(req.block_ids[sent.blocks:end]), sent.messages, 0, first_block=sent.blocks)
        sent.blocks, sent.messages, sent.bytes = end, sent.messages + 1, sent.bytes + chunk.progress.bytes

    def send(self, req: TransferRequest) -> None:  # the last chunk: every block not sent yet
        sent = self._sent.pop(req.transfer_id, _Sent())
        self.post(req, self.gather(req.block_ids[sent.blocks:]), sent.messages, sent.messages + 1,
                  first_block=sent.blocks)
        req.progress.messages += sent.messages
        req.progress.bytes += sent.bytes

    # decode side
    def receive(self, req: TransferRequest) -> None:
        for msg in self.collect(req):
            self.scatter(req, msg.payload, first_block=msg.meta["first_block"])
