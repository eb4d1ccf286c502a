"""A strategy that moves the KV but tells vLLM there is nothing to load, so the decode engine
computes the whole prompt itself: the failure that passes every output check (and, with digests
off, every other check). Only the compute records show it."""

from transfer_strategies.fused import FusedConnector


class IgnoresTheKV(FusedConnector):
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        self.scheduler.matched_tokens(request, num_computed_tokens)  # the base's bookkeeping, as usual
        return 0, False
