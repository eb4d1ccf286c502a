"""workload=multiturn without engines: the conversations the builder plans, and the order in which
the offline runner's pipeline sends their turns (a fake engine answers)."""

import json

import pytest
from omegaconf import OmegaConf

import harness.offline.pipeline
from harness.offline.pipeline import pipeline
from harness.records.summary import summarize
from harness.records.tables import prefix_hit_lines
from harness.workload import WorkloadError, multiturn, warmup_workload
from tests.helpers.config import compose_job
from tests.helpers.tokenizer import FakeTokenizer

BLOCK = 32


def conversations(**kw):
    args = {"num_conversations": 3, "turns": 4, "first_user_len": 40, "user_len": 8, "answer_len": 8,
            "block_size": BLOCK, "tokenizer": FakeTokenizer(), "seed": 0, "concurrency": 2, **kw}
    return multiturn("multiturn", **args)


def answer_all(w, answer=lambda p: [2 + p.index % 40] * 8):
    """Each turn answered in order, as the baseline pass does: the later turns' ids are built."""
    for p in w.prompts:
        w.answered(p, answer(p))


def test_each_turn_extends_the_previous_turn_and_its_answer():
    w = conversations()
    # runner=serve warms up before the baseline has answered anything: as long as the longest turn anyway
    assert len(warmup_workload(w, 1).prompts[0].token_ids) == max(map(w.prompt_len, w.prompts))
    assert [(p.conversation, p.turn) for p in w.prompts] == [(c, t) for c in range(3) for t in range(4)]
    assert all(p.token_ids == [] for p in w.prompts if p.turn)  # not known before the previous turn's answer
    answer_all(w)
    for p in w.prompts:
        assert len(p.token_ids) == w.prompt_len(p)
        if p.turn:
            prev = w.prompts[p.follows]
            assert prev.conversation == p.conversation and prev.turn == p.turn - 1
            assert p.token_ids[:len(prev.token_ids)] == prev.token_ids
            assert p.token_ids[len(prev.token_ids):][:8] == [2 + prev.index % 40] * 8  # its answer
        assert all(t not in (0, 1) for t in w.user_ids[p.index])  # no special tokens
    # answered again (the baseline's repeat, another pass): the prompts stay as built
    built = [list(p.token_ids) for p in w.prompts]
    answer_all(w, lambda p: [3] * 8)
    assert [p.token_ids for p in w.prompts] == built


def test_turns_2_4_end_on_a_block_boundary_and_turns_1_3_inside_a_block():
    for first, user in ((40, 8), (32, 0), (1, 24), (64, 32)):
        w = conversations(first_user_len=first, user_len=user)
        for p in w.prompts:
            assert (w.prompt_len(p) % BLOCK == 0) == (p.turn % 2 == 1), (first, user, p)
            base = first if p.turn == 0 else user
            assert base <= len(w.user_ids[p.index]) < base + BLOCK


def test_the_conversations_repeat_with_their_seed():
    a, b, c = conversations(), conversations(), conversations(seed=1)
    assert a.user_ids == b.user_ids and a.user_ids != c.user_ids


@pytest.mark.parametrize("kw,max_model_len,max_tokens,message", [
    ({"turns": 0}, 512, 8, "workload.turns and workload.num_conversations must be >= 1"),
    ({"num_conversations": 0}, 512, 8, "must be >= 1"),
    ({"first_user_len": 0}, 512, 8, "workload.first_user_len must be >= 1"),
    ({}, 100, 8, "reaches 96 prompt tokens at turn 4; with its answer of 8 it needs engine.max_model_len >= 104"),
    ({}, 512, 16, "workload.answer_len=8 but sampling.max_tokens=16"),
    ({"concurrency": 0}, 512, 8, "workload.concurrency must be >= 1"),
])
def test_bad_conversations_are_refused(kw, max_model_len, max_tokens, message):
    with pytest.raises(WorkloadError, match=message):
        conversations(**kw).check_fits(max_model_len, max_tokens)


class FakeEngine:
    """Answers the oldest request it holds at each next_events call."""

    name = "fake"

    def __init__(self):
        self.held, self.submitted, self.held_at_submit = [], [], []

    def submit(self, req_id, token_ids, sampling):
        self.held.append(req_id)
        self.submitted.append((req_id, list(token_ids)))
        self.held_at_submit.append([int(r) for r in self.held])  # a request's id: its prompt's index


def test_the_pipeline_sends_a_turn_after_its_previous_turn_finished_interleaving_conversations(monkeypatch):
    w = conversations()
    engine = FakeEngine()

    def next_events(engines, wait_s):
        rid = engine.held.pop(0)
        return [(engine, "done", {"req_id": rid, "token_ids": [5] * w.answer_len, "first_token_t": 0.0,
                                  "finished_t": 0.0})]
    monkeypatch.setattr(harness.offline.pipeline, "next_events", next_events)
    finished = []

    def on_finish(p, t0, results):
        finished.append(p.index)
        w.answered(p, results[0]["token_ids"])  # as the baseline pass does
    pipeline([[(engine, lambda p, r: {})]], w, 10, on_finish)
    assert sorted(finished) == list(range(len(w.prompts)))
    order = {int(rid): n for n, (rid, _) in enumerate(engine.submitted)}
    for p in w.prompts:
        if p.turn:
            assert finished.index(p.follows) < order[p.index]  # sent once its previous turn had finished
    for rid, ids in engine.submitted:
        assert ids == w.prompts[int(rid)].token_ids and ids  # built before it was sent
    in_flight = [[w.prompts[i].conversation for i in held] for held in engine.held_at_submit]
    assert max(map(len, in_flight)) == 2 and all(len(set(c)) == len(c) for c in in_flight)  # one turn each
    assert in_flight[:2] == [[0], [0, 1]]  # workload.concurrency conversations at once, interleaved
    # the warm-up (run.warmup_requests) is as long as the longest turn, and continues no conversation
    warm = warmup_workload(w, 1)
    assert len(warm.prompts[0].token_ids) == max(map(len, (p.token_ids for p in w.prompts)))
    assert warm.prompts[0].follows is None


def test_the_summary_counts_the_decode_engines_prefix_hits_and_the_bytes_sent_for_them():
    rows = [{"match": True, "bytes": 400, "blocks": 2, "skip_blocks": 0},
            {"match": True, "bytes": 800, "blocks": 4, "skip_blocks": 1},
            {"match": True, "bytes": 0, "blocks": 0, "skip_blocks": 0}]
    s = summarize(rows)
    assert (s["decode_prefix_hit_blocks"], s["bytes_for_cached_blocks"], s["total_bytes"]) == (1, 200, 1200)
    assert prefix_hit_lines(s) == ["decode prefix-cache hits: 1 prompt blocks the decode engine already had; "
                                   "the transfers carried 200 of the 1200 bytes moved for them"]
    none = summarize([{"match": True, "bytes": None, "blocks": None, "skip_blocks": None}])  # vLLM's connectors
    assert none["decode_prefix_hit_blocks"] is None and prefix_hit_lines(none) == []


def test_the_composed_config_builds_conversations_that_follow_the_engines_and_the_sampling():
    """As `python -m harness workload=multiturn ...` composes it: answer_len is sampling.max_tokens
    and the block boundaries are engine.block_size's."""
    from harness.workload import build_workload

    cfg = compose_job(["workload=multiturn", "workload.num_conversations=2", "workload.turns=3",
                       "sampling.max_tokens=8", "engine.block_size=64"])
    w = build_workload(cfg.workload, FakeTokenizer())
    assert w.answer_len == 8 and len(w.prompts) == 6 and w.concurrency == 2
    assert [w.prompt_len(p) % 64 == 0 for p in w.prompts] == [False, True, False] * 2
    w.check_fits(cfg.engine.max_model_len, cfg.sampling.max_tokens)


def test_serving_a_conversation_sends_each_turn_once_the_previous_has_its_answer():
    """runner=serve's schedule and client against a fake server that answers each prompt with its
    own length: each arrival starts a conversation, each later turn is sent once the previous one
    has ended, with the ids the baseline pass built from that answer."""
    import asyncio

    from aiohttp import web

    from harness.serving.checks import check_serve_workload
    from harness.serving.load import LoadSpec, send_all
    from harness.serving.schedule import request_schedule

    w = conversations(num_conversations=2, turns=3)
    spec = LoadSpec(request_rate=float("inf"), num_requests=3)
    schedule = request_schedule(spec, w)  # 3 arrivals: conversations 0, 1, then 0 again
    assert [(w.prompts[r.prompt_idx].conversation, w.prompts[r.prompt_idx].turn, r.follows) for r in schedule] == \
        [(0, 0, None), (0, 1, 0), (0, 2, 1), (1, 0, None), (1, 1, 3), (1, 2, 4), (0, 0, None), (0, 1, 6), (0, 2, 7)]
    with pytest.raises(Exception, match="serve.cancel_fraction"):
        check_serve_workload(OmegaConf.create({"scenario": {}}), LoadSpec(request_rate=1.0, cancel_fraction=0.5), w)
    with pytest.raises(Exception, match="scenario.aborts"):
        check_serve_workload(OmegaConf.create({"scenario": {"aborts": {"fraction": 0.5, "max_delay_ms": 60}}}),
                             LoadSpec(request_rate=1.0), w)
    received = []

    async def complete(request):
        body = await request.json()
        received.append(body["prompt"])
        await asyncio.sleep(0.01)
        resp = web.StreamResponse()
        await resp.prepare(request)
        chunk = {"choices": [{"token_ids": [2 + len(body["prompt"]) % 40] * body["max_tokens"]}]}
        await resp.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
        return resp

    async def serve_once():
        app = web.Application()
        app.router.add_post("/v1/completions", complete)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        try:
            return await send_all(url, "m", schedule, max_tokens=w.answer_len, max_concurrency=None, timeout_s=30,
                                  id_prefix="t", on_result=lambda r: w.answered(w.prompts[r.prompt_idx], r.token_ids),
                                  turn_ids=lambda req: w.prompts[req.prompt_idx].token_ids)
        finally:
            await runner.cleanup()

    results = asyncio.run(serve_once())
    assert [r.status for r in results] == ["ok"] * 9
    for req, r in zip(schedule, results):
        assert r.prompt_len == w.prompt_len(w.prompts[req.prompt_idx])
        if req.follows is not None:
            prev = results[req.follows]
            assert r.t_sent >= prev.t_sent + prev.t_done  # sent once the previous turn had ended
    assert sorted(map(len, received)) == sorted(w.prompt_len(w.prompts[r.prompt_idx]) for r in schedule)
    assert all(p.token_ids for p in w.prompts)
