"""One vLLM engine in its own OS process, driven by the harness over a pipe.

The child builds `vllm.LLM` and runs a loop: take requests from the pipe, step the engine,
report each request's first token and its end with `time.monotonic()` stamps (one clock for
every process on the machine, so the harness can subtract stamps taken in different engines).

Why a process per engine: the prefill and decode engines must run at the same time; a run
must survive an engine dying and say so; and a vLLM engine deleted in-process does not give
its GPU memory back. Each child leads its own process group and dies with the harness
(PR_SET_PDEATHSIG), so stopping it stops everything it started.

How it starts: a CPU engine is forked from a server process that imported vLLM once, a CUDA
engine is spawned (harness/forkserver.py says why).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_any
from pathlib import Path

from harness import process_group
from harness.forkserver import NETNS_ENV, context, die_with_parent

VLLM_ON_CPU = "transfer_strategies.vllm_on_cpu"  # vLLM's connectors, started on the CPU build (a strategy's cpu_module)


class EngineDied(RuntimeError):
    pass


CONNECTOR_STEP_S = 0.002


def _kv_blocks_in_use(engine) -> int | None:
    """KV blocks some request holds (cached blocks no request holds are free): 0 when the engine
    is idle and nothing leaked. None where vLLM's internals differ (they are not an API)."""
    try:
        pool = engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
        return pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()  # the null block is never free
    except AttributeError:
        return None


def _finishing(engine) -> bool:
    """Requests finished in the last step whose end the workers have not heard yet: one more step
    tells them (kv_connector_no_forward), and a connector there may act on it (the observer
    digests a finished prefill request's blocks then, transfer_strategies/observer.py)."""
    try:
        return bool(engine.engine_core.engine_core.scheduler.finished_req_ids)
    except AttributeError:
        return False


def _has_work(engine) -> bool:
    """Whether vLLM's own engine loop would step now (EngineCore.has_work: the scheduler's
    has_requests): unfinished requests, finished ones whose blocks a connector still holds (vLLM's
    NIXL prefill until the decode engine read them), a connector's push work in flight
    (NixlPushConnector ships the prefill's finished blocks to its worker at a step, which then
    WRITEs them). Where a vLLM lacks has_requests: unfinished requests and those finished in the
    last step."""
    try:
        return bool(engine.engine_core.engine_core.scheduler.has_requests())
    except AttributeError:
        return engine.has_unfinished_requests() or _finishing(engine)


def _settle(engine, wait_s: float = 5.0) -> None:
    """Steps for an idle engine whose finished requests still hold blocks, until they are freed or
    wait_s has passed. A connector may free a finished request's blocks on a later step (vLLM's
    NIXL connector: when the decode engine's notice that it read them comes), and an idle engine
    takes none: its blocks would look leaked, and its prefix cache could not be emptied for the
    next run on it (vLLM refuses while a request holds blocks)."""
    try:
        scheduler = engine.engine_core.engine_core.scheduler
    except AttributeError:
        return
    deadline = time.monotonic() + wait_s
    while not engine.has_unfinished_requests() and scheduler.has_finished_requests() and time.monotonic() < deadline:
        engine.step()
        time.sleep(0.01)


def _worker_held(_worker=None) -> dict | None:
    """What the connector worker of this process holds (None: not one of this project's)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    worker = getattr(get_kv_transfer_group(), "worker", None) if has_kv_transfer_group() else None
    return worker.held() if worker is not None and hasattr(worker, "held") else None


def _transfer_held(engine) -> dict | None:
    """What this engine's connector workers still hold, added up over its workers: in this
    process when the engine has one worker (the engine core and its worker in-process here),
    else asked of each worker process (tensor parallelism). None where unknown."""
    try:
        held = _worker_held()
        if held is not None:
            return held
        per_worker = [h for h in engine.collective_rpc(_worker_held) if h is not None]
        if not per_worker:
            return None
        return {k: sum(h.get(k, 0) for h in per_worker) for k in per_worker[0]}
    except Exception:  # noqa: BLE001 - vLLM's internals differ between versions: then unknown
        return None


def enter_netns(name: str) -> None:
    """Move this process into the named Linux network namespace (`ip netns add NAME`), as
    `ip netns exec` does: with a mount namespace of its own whose /sys is the network
    namespace's, where libraries list the interfaces (UCX does: without it, NIXL saw only lo).
    Threads and processes started afterwards are in both. Call it while single-threaded."""

    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot enter network namespace {name}: {what}: {os.strerror(err)}")

    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        check(libc.setns(fd, 0x40000000), "setns")  # CLONE_NEWNET
    finally:
        os.close(fd)
    check(libc.unshare(0x00020000), "unshare")  # CLONE_NEWNS
    check(libc.mount(b"", b"/", b"none", 0x4000 | 0x80000, None), "mount / private")  # MS_REC | MS_SLAVE
    check(libc.umount2(b"/sys", 2), "umount /sys")  # MNT_DETACH
    check(libc.mount(name.encode(), b"/sys", b"sysfs", 0, None), "mount /sys")


def own_warmup_prompts(seed: int, max_model_len: int) -> list[list[int]]:
    """The prompts an engine warms up on as it starts, token ids in [3, 100) (inside every model's
    vocabulary). They carry no kv_transfer_params, so this project's connectors move nothing, but
    vLLM's ExampleConnector stores and loads any prompt by its tokens alone: each engine's prompts
    are its own (seed: its pid). With one set for all, a decode engine warming up beside its
    prefill engine loaded files the other was still writing (FileNotFoundError; CI, 2026-12-07)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, 100) for _ in range(n)] for n in (3, 40, 100) if n + 3 <= max_model_len]


def _serve(conn, name: str, engine_args: dict, env: dict, log_path: str) -> None:
    os.setsid()
    die_with_parent()
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - the engine's stdout and stderr until it exits
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    os.environ.update(env)
    try:
        if os.environ.get(NETNS_ENV):
            enter_netns(os.environ[NETNS_ENV])
        t0 = time.monotonic()
        from vllm import LLM, SamplingParams
        from vllm.config import KVTransferConfig

        from harness.vllm_cli import keep_a_fork_start

        keep_a_fork_start()  # TP workers forked from this process, which imported vLLM

        # vLLM's own connectors (named, no module path but vllm_on_cpu's) step as vLLM's engine loop steps them
        # (_has_work); this project's need a step only once a request finished (_finishing):
        # stepping while they hold a finished request's blocks cost 1-15 s a run on the 2-core
        # machine, and _settle frees those
        kv = engine_args.get("kv_transfer_config")
        vllm_loop = isinstance(kv, dict) and kv.get("kv_connector_module_path") in (None, VLLM_ON_CPU)
        if isinstance(engine_args.get("kv_transfer_config"), dict):
            engine_args = dict(engine_args, kv_transfer_config=KVTransferConfig(**engine_args["kv_transfer_config"]))
        llm = LLM(**engine_args)
        # The first requests pay one-off costs (kernel selection, allocator growth): keep them
        # out of the measurements
        for prompt in own_warmup_prompts(os.getpid(), engine_args.get("max_model_len", 103)):
            llm.generate([{"prompt_token_ids": prompt}],
                         SamplingParams(max_tokens=3, ignore_eos=True, detokenize=False, logprobs=1), use_tqdm=False)
        engine = llm.llm_engine
        engine.reset_prefix_cache()  # a run starts with an empty cache, as one on a kept engine does
        # as vLLM resolved it: eager mode, the backend and the connector may each have changed it
        mode = getattr(engine.vllm_config.compilation_config, "cudagraph_mode", None)
        conn.send(("ready", {"startup_s": time.monotonic() - t0, "cudagraph_mode": getattr(mode, "name", None)}))
        first_token: dict[str, float] = {}
        live: set[str] = set()  # submitted, not reported done
        aborted: set[str] = set()  # reported done when aborted: vLLM's later output for them is dropped
        while True:
            unfinished = engine.has_unfinished_requests()
            busy = unfinished or (_has_work(engine) if vllm_loop else _finishing(engine))
            # with only vLLM's connector's work left, a step every CONNECTOR_STEP_S: the cores are
            # the other engines' meanwhile (vLLM's own loop steps without a pause); this project's
            # connectors take their one step after a finish at once, as before
            idle_step = CONNECTOR_STEP_S if vllm_loop and not unfinished else 0
            while conn.poll(idle_step if busy else 0.2):
                cmd, *args = conn.recv()
                if cmd == "stop":
                    # vLLM's own teardown can take many seconds; the parent kills the group anyway
                    sys.stdout.flush()
                    os._exit(0)
                if cmd == "usage":
                    _settle(engine)
                    conn.send(("usage", {"kv_blocks_in_use": _kv_blocks_in_use(engine),
                                         "transfer_held": _transfer_held(engine)}))
                    continue
                if cmd == "reset_prefix_cache":  # between passes over the same prompts
                    _settle(engine)
                    conn.send(("reset_prefix_cache", {"ok": bool(engine.reset_prefix_cache())}))
                    continue
                if cmd == "abort":  # as a client going away would: vLLM frees what the request holds
                    (req_id,) = args
                    if req_id not in live:  # finished meanwhile: its done is on its way
                        continue
                    live.discard(req_id)
                    engine.abort_request([req_id])
                    aborted.add(req_id)
                    now = time.monotonic()
                    conn.send(("done", {"req_id": req_id, "token_ids": [], "logprobs": None,
                                        "first_token_t": first_token.pop(req_id, now), "finished_t": now,
                                        "finish_reason": "abort", "kv_transfer_params": None}))
                    continue
                req_id, token_ids, sampling = args
                # a request id comes back in every pass and every run on a kept baseline engine (its
                # prompt's index): vLLM emits nothing more for an aborted one, so its entry would drop
                # the new one's outputs (an aborts run's request 4 hung the next run's, 300 s, once in three)
                aborted.discard(req_id)
                engine.add_request(req_id, {"prompt_token_ids": token_ids}, SamplingParams(**sampling))
                live.add(req_id)
                busy = True
            if not busy:
                continue
            for out in engine.step():
                if out.request_id in aborted:
                    if out.finished:
                        aborted.discard(out.request_id)
                    continue
                now = time.monotonic()
                comp = out.outputs[0]
                if out.request_id not in first_token and comp.token_ids:
                    first_token[out.request_id] = now
                if out.finished:
                    live.discard(out.request_id)
                    logprobs = top_ids = None
                    if comp.logprobs is not None:
                        logprobs = [lp[t].logprob for lp, t in zip(comp.logprobs, comp.token_ids)]
                        top_ids = [sorted(lp, key=lambda t, lp=lp: lp[t].rank) for lp in comp.logprobs]
                    conn.send(("done", {"req_id": out.request_id, "token_ids": list(comp.token_ids),
                                        "logprobs": logprobs, "top_ids": top_ids,
                                        "first_token_t": first_token.pop(out.request_id, now),
                                        "finished_t": now, "finish_reason": comp.finish_reason,
                                        "kv_transfer_params": getattr(out, "kv_transfer_params", None)}))
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        with contextlib.suppress(Exception):  # the parent may be gone already
            conn.send(("error", {"traceback": traceback.format_exc()}))
        os._exit(1)


@dataclass
class EngineProcess:
    """Parent-side handle of one engine process."""

    name: str
    engine_args: dict
    env: dict
    log_path: Path
    conn: object = field(init=False)
    proc: object = field(init=False)
    startup_s: float = field(init=False, default=float("nan"))
    cudagraph_mode: str | None = field(init=False, default=None)
    segments: set[str] = field(init=False, default_factory=set)  # /dev/shm files its processes mapped when ready

    def __post_init__(self):
        self.semaphores_before = process_group.semaphores()
        ctx = context(self.env)
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, name=f"engine-{self.name}",
                                args=(child, self.name, self.engine_args, self.env, str(self.log_path)))
        self.proc.start()
        child.close()
        self.started_at = time.monotonic()

    def submit(self, req_id: str, token_ids: list[int], sampling: dict) -> None:
        try:
            self.conn.send(("submit", req_id, token_ids, sampling))
        except (BrokenPipeError, OSError):
            raise EngineDied(self.failure_message()) from None

    def abort(self, req_id: str) -> None:
        """Abort a request (it is reported done, finish_reason "abort", if it had not finished)."""
        try:
            self.conn.send(("abort", req_id))
        except (BrokenPipeError, OSError):
            raise EngineDied(self.failure_message()) from None

    def usage(self, timeout_s: float = 30.0) -> dict:
        """What the engine holds now (between requests): {"kv_blocks_in_use": n}."""
        return self._ask("usage", timeout_s)

    def reset_prefix_cache(self, timeout_s: float = 30.0) -> bool:
        """Empty its prefix cache (between requests), so that the same prompts are computed again."""
        return self._ask("reset_prefix_cache", timeout_s)["ok"]

    def _ask(self, cmd: str, timeout_s: float) -> dict:
        try:
            self.conn.send((cmd,))
        except (BrokenPipeError, OSError):
            raise EngineDied(self.failure_message()) from None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for _, kind, info in next_events([self], 1.0):
                if kind == cmd:
                    return info
        raise EngineDied(f"the {self.name} engine did not answer within {timeout_s:.0f} s")

    def failure_message(self) -> str:
        code = self.proc.exitcode
        tail = ""
        with contextlib.suppress(OSError):
            tail = "".join(Path(self.log_path).read_text(errors="replace").splitlines(keepends=True)[-25:])
        return (f"the {self.name} engine (pid {self.proc.pid}) died"
                f"{f' with exit code {code}' if code is not None else ''}; last lines of {self.log_path}:\n{tail}")

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop the engine and everything it started, and the shared memory its workers leave
        (harness/process_group.py); safe to call more than once."""
        if self.proc.pid is None:
            return
        # noted at ready too: it may have died since
        segments = self.segments | process_group.segments_of_group(self.proc.pid)
        try:
            self._stop_group(grace_s)
        finally:
            # and the semaphores its processes opened and closed again: this process's resource
            # tracker, which they share, unlinks them only when this process exits (a sweep, a
            # test session: many runs later); none opens one again once it has started
            process_group.remove_unmapped(segments | (process_group.semaphores() - self.semaphores_before))

    def _stop_group(self, grace_s: float) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send(("stop",))
                self.proc.join(grace_s)
            except (BrokenPipeError, OSError):
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGTERM)  # the child leads its own process group
            self.proc.join(3)
        process_group.kill(self.proc.pid, lambda: self.proc.join(0))
        self.proc.join(1)


def next_events(engines: list[EngineProcess], timeout_s: float) -> list[tuple[EngineProcess, str, dict]]:
    """Wait up to timeout_s for messages from any engine; an engine that dies raises EngineDied."""
    by_conn = {e.conn: e for e in engines}
    by_sentinel = {e.proc.sentinel: e for e in engines}
    ready = wait_any(list(by_conn) + list(by_sentinel), timeout_s)
    events = []
    for r in ready:
        if r in by_conn:
            e = by_conn[r]
            try:
                while e.conn.poll():
                    kind, info = e.conn.recv()
                    if kind == "error":
                        e.proc.join(5)
                        raise EngineDied(e.failure_message())
                    events.append((e, kind, info))
            except (EOFError, OSError):
                e.proc.join(5)
                raise EngineDied(e.failure_message()) from None
    for r in ready:
        if r in by_sentinel and not any(ev[0] is by_sentinel[r] for ev in events):
            raise EngineDied(by_sentinel[r].failure_message())
    return events


def wait_ready(engines: list[EngineProcess], timeout_s: float) -> None:
    """Block until every engine has built its LLM, or fail on the first death or the deadline."""
    pending = {e.name: e for e in engines}
    deadline = time.monotonic() + timeout_s
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise EngineDied(f"engines {sorted(pending)} not ready after {timeout_s:.0f} s")
        for e, kind, info in next_events(list(pending.values()), min(left, 1.0)):
            if kind == "ready":
                e.startup_s = info["startup_s"]
                e.cudagraph_mode = info.get("cudagraph_mode")
                e.segments = process_group.segments_of_group(e.proc.pid)
                pending.pop(e.name)
