"""A strategy whose prefill side says it sent one prompt token fewer than the decode engine then
starts from: the miscount class of a vLLM issue (a worker retrieving another number of tokens
than vLLM accounted for), here in the direction that leaves the decode engine trusting KV nobody
claimed to send. Where the token falls inside a block both sides copy whole, the payload has the
size the decode side expects, every block's digest and every output match; only the token
counts show it (decode_cached_tokens above sent_tokens)."""

from transfer_strategies.fused import FusedConnector


class SendsOneTokenShort(FusedConnector):
    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        send = self.scheduler._sends.get(request.request_id) if self.is_producer else None
        if send is not None:  # its blocks are cut to this count when it is sent (scheduler.py)
            send.num_tokens -= 1
