"""`specdecode serve --ray`: the OpenAI routes as a Ray Serve application of several decode replicas.

Two deployments. ``DecodeReplica`` (N of them, placed and replaced by Ray) each builds the state
``serve`` builds and runs the very app ``create_app`` makes, called in-process: same routes,
limits, API key, Host check and error bodies, one decode core with its drafters; no decode logic
lives here. ``Front`` (one, no CPU of its own) is the ingress behind Ray's HTTP proxy, on
--host/--port: it forwards each request to a replica through Ray's router (least loaded of two
picks; a chat's follow-up turn prefers the replica that served its first turn, through Ray's
model-multiplexing ids) and owns failover, which Ray's proxy alone does not give: a request
whose replica dies before a byte reached the client is sent again to another replica; a stream
already under way ends with an error event and ``[DONE]``. It also answers /health and
/metrics from what every replica reports each second, merged (``replica_views.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional, cast

import ray
import torch
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, RequestCancelledError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from ..cli import CLIError
from .app import create_app
from .startup import build_state
from .config import ServerConfig
from .guard import ASGIApp, BodyLimit, Message, Receive, Scope, SecurityHeaders, Send, error_json, send_json
from .hosts import HostCheck
from .protocol import error_body, new_id
from .ray_config import (CONVERSATIONS_PER_REPLICA, DOWNSCALE_DELAY_S, UPSCALE_DELAY_S, RayConfig,
                         conversation_key)
from .replica_views import Report, fresh, merged_health, merged_metrics, only_role_chunks

log = logging.getLogger("specdecode.server")

APP_NAME = "specdecode"
FRONT, CORE = "Front", "DecodeReplica"
REPORT_EVERY_S = 1.0
ATTEMPTS = 4  # a request whose replica died is sent again, to another replica, up to this many times in all
RETRY_PAUSE_S = 0.5  # doubled after each failed attempt: Ray learns of a death within about a second
RETRY_AFTER_S = 2  # what a client is told to wait when no replica could take its request
# Ray's own lines at warning and up, no line per request (reports come every second from each replica)
RAY_LOGGING = {"log_level": "WARNING", "enable_access_log": False}
LOCAL_OBJECT_STORE_BYTES = 256 << 20  # requests and answers are small; Ray's default takes 30% of the RAM
SSE_ERROR = (b'data: {"error":{"message":"the replica serving this stream stopped (it will be replaced); '
             b'send the request again","type":"server_error","param":null,"code":"replica_lost"}}\n\n'
             b"data: [DONE]\n\n")
RETRYABLE = (RayActorError, DeploymentUnavailableError)
REPLICA_HEADER = b"x-specdecode-replica"  # which replica answered: for logs, and to see follow-ups stay put


@dataclass(frozen=True)
class Forwarded:
    """One HTTP request as the front read it, for a replica to run through its own app."""

    method: str
    path: str
    query_string: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    client: Optional[tuple[str, int]]
    conversation: Optional[str]  # the chat's key (ray_config.conversation_key): the replica remembers it


@dataclass(frozen=True)
class FrontLimits:
    """What the front checks itself, as the single-process server does (no API key: it never reads one)."""

    host: str
    allowed_hosts: Optional[str]
    has_api_key: bool
    max_body_bytes: int
    replicas_wanted: int


class DecodeReplica:
    """One decode core behind Ray: ``serve``'s state and app, called in-process by ``forward``."""

    async def __init__(self, args: argparse.Namespace, threads: int) -> None:  # type: ignore[misc]  # Ray awaits it
        torch.set_num_threads(1)  # as cmd_serve: only the engine thread runs parallel ops
        state = await asyncio.to_thread(build_state, args, threads)
        self.app = create_app(state)
        self.state = state
        self._life = self.app.router.lifespan_context(self.app)
        await self._life.__aenter__()  # the scheduler's thread starts, as under uvicorn
        context = serve.get_replica_context()
        self.replica = context.replica_id.unique_id
        self.front = serve.get_deployment_handle(FRONT, context.app_name)
        self._reporter = asyncio.create_task(self._report_forever())

    @serve.multiplexed(max_num_models_per_replica=CONVERSATIONS_PER_REPLICA)
    async def conversation(self, key: str) -> str:
        """Remember a conversation: Ray's router then sends its next turns here while this replica has room."""
        return key

    async def forward(self, req: Forwarded) -> AsyncIterator[tuple[Any, ...]]:
        """Run ``req`` through the app: ("head", status, headers, is_sse), then ("body", bytes) pieces as a stream
        produces them, or one ("body", whole) for any other answer (so that it can be sent again elsewhere)."""
        if req.conversation is not None:
            await self.conversation(req.conversation)
        scope: Scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                        "method": req.method, "scheme": "http", "path": req.path, "raw_path": req.path.encode(),
                        "query_string": req.query_string, "root_path": "", "headers": req.headers,
                        "client": req.client, "server": (self.state.config.host, self.state.config.port)}
        out: asyncio.Queue[Optional[Message]] = asyncio.Queue()
        gone = asyncio.Event()
        body_given = False

        async def receive() -> Message:
            nonlocal body_given
            if not body_given:
                body_given = True
                return {"type": "http.request", "body": req.body, "more_body": False}
            await gone.wait()  # the front cancelled us: the client went away, or the request ended
            return {"type": "http.disconnect"}

        async def run() -> None:
            try:
                await self.app(scope, receive, out.put)
            except Exception:  # the app has answered 500 with a reference and logged it
                pass
            finally:
                await out.put(None)

        task = asyncio.create_task(run())
        sse, whole, ended, held, yielded = False, bytearray(), False, bytearray(), False
        try:
            while not ended and (msg := await out.get()) is not None:
                if msg["type"] == "http.response.start":
                    headers = [(bytes(k), bytes(v)) for k, v in msg.get("headers", [])]
                    sse = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)
                    yield ("head", msg["status"], headers + [(REPLICA_HEADER, self.replica.encode())], sse)
                    continue
                piece = bytearray(msg.get("body", b""))
                if not sse:
                    whole += piece
                    continue
                while not out.empty():  # what is ready goes as one piece: one Ray message, not one per event
                    nxt = out.get_nowait()
                    if nxt is None:
                        ended = True
                        break
                    piece += nxt.get("body", b"")
                if not yielded and not ended and only_role_chunks(piece):
                    held += piece  # a chat stream's opening: sent with its first token, so until then the
                    continue  # front may still send the request to another replica if this one dies
                if piece or held:
                    yield ("body", bytes(held + piece))
                    held, yielded = bytearray(), True
            if held or not sse:
                yield ("body", bytes(held or whole))
        finally:
            gone.set()
            if not task.done():
                try:
                    await asyncio.wait_for(asyncio.shield(task), 5.0)
                except (asyncio.TimeoutError, asyncio.CancelledError):
                    task.cancel()

    async def _get(self, path: str) -> bytes:
        """This replica's own answer to GET ``path`` (a route that needs no key)."""
        chunks: list[bytes] = []
        req = Forwarded("GET", path, b"", [(b"host", b"localhost")], b"", None, None)
        async for msg in self.forward(req):
            if msg[0] == "body":
                chunks.append(msg[1])
        return b"".join(chunks)

    async def _report_forever(self) -> None:
        while True:
            try:
                health = json.loads(await self._get("/health"))
                metrics = (await self._get("/metrics")).decode()
                await self.front.report.remote(self.replica, health, metrics)
            except Exception as e:  # the front is starting or being replaced: the next report goes through
                log.debug("report to the front failed: %s", e)
            await asyncio.sleep(REPORT_EVERY_S)

    async def __del__(self) -> None:
        """Ray stops this replica after its running requests had ``graceful_shutdown_timeout_s`` (the drain):
        what still runs ends now with an error event, as at the end of ``serve``'s drain."""
        if not hasattr(self, "_reporter"):  # the constructor failed: nothing was started
            return
        self._reporter.cancel()
        self.state.scheduler.begin_drain(0.0)
        await self._life.__aexit__(None, None, None)


class Front:
    """The ingress: forwards to the replicas with failover; /health and /metrics from their reports."""

    async def __init__(self, core: DeploymentHandle, limits: FrontLimits) -> None:  # type: ignore[misc]  # Ray awaits it
        self.core, self.limits = core.options(stream=True), limits
        self.reports: dict[str, Report] = {}

    def __serve_build_asgi_app__(self) -> ASGIApp:
        lim = self.limits
        app: ASGIApp = BodyLimit(self._asgi, limit=lim.max_body_bytes)
        if not lim.has_api_key:  # as the single-process app: a foreign Host is refused before anything else
            app = HostCheck(app, bound_host=lim.host, allowed=lim.allowed_hosts)
        return SecurityHeaders(app)

    async def report(self, replica: str, health: dict[str, Any], metrics: str) -> None:
        self.reports[replica] = Report(replica, health, metrics, time.monotonic())
        stale = [k for k, r in self.reports.items() if r not in fresh([r])]
        for k in stale:
            del self.reports[k]

    async def health(self) -> tuple[int, dict[str, Any]]:
        return merged_health(fresh(self.reports.values()), self.limits.replicas_wanted)

    async def _asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method in ("GET", "HEAD") and path in ("/health", "/metrics", "/metrics/replicas"):
            await self._answer_local(path, send)
            return
        body = await _read_body(receive)
        if body is None:
            return
        key, follow_up = None, False
        if method == "POST" and path == "/v1/chat/completions":
            key, follow_up = await asyncio.to_thread(conversation_key, body)
        req = Forwarded(method, path, scope.get("query_string", b""), list(scope.get("headers", [])), body,
                        scope.get("client"), key)
        await self._forward(req, key if follow_up else None, send)

    async def _answer_local(self, path: str, send: Send) -> None:
        live = fresh(self.reports.values())
        if path == "/health":
            status, body = merged_health(live, self.limits.replicas_wanted)
            extra = [(b"retry-after", str(RETRY_AFTER_S).encode())] if status == 503 else []
            data = json.dumps(body).encode()
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(data)).encode()), *extra]})
        else:
            data = merged_metrics(live, per_replica=path == "/metrics/replicas").encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
                                    (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    async def _forward(self, req: Forwarded, affinity: Optional[str], send: Send) -> None:
        """Send ``req`` to a replica, again to another while nothing has reached the client (see the module).
        A client that goes away needs no watching here (which would cost a call to the proxy per request):
        Ray's proxy cancels this task, and the cancellation reaches the replica's work."""
        gen: Optional[DeploymentResponseGenerator] = None
        sent = False  # any byte has reached the client: from here a failure cannot be hidden by a retry
        head: Optional[tuple[Any, ...]] = None
        try:
            for attempt in range(ATTEMPTS):
                handle = self.core.options(multiplexed_model_id=affinity) if affinity else self.core
                gen = cast(DeploymentResponseGenerator, handle.forward.remote(req))  # stream=True: a generator
                try:
                    async for msg in gen:
                        if msg[0] == "head":
                            head = msg
                            continue
                        assert head is not None
                        if not sent:
                            await send({"type": "http.response.start", "status": head[1], "headers": head[2]})
                            sent = True
                        await send({"type": "http.response.body", "body": msg[1], "more_body": True})
                    if not sent and head is not None:
                        await send({"type": "http.response.start", "status": head[1], "headers": head[2]})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
                except RETRYABLE as e:
                    if sent:
                        log.warning("replica lost during an answer (%s); the stream ends with an error event",
                                    type(e).__name__)
                        if head is not None and head[3]:
                            await send({"type": "http.response.body", "body": SSE_ERROR, "more_body": False})
                        return  # a non-stream answer is sent whole: only a stream can be cut midway
                    log.warning("replica lost before answering (%s); attempt %d of %d", type(e).__name__,
                                attempt + 1, ATTEMPTS)
                    head = None
                    await asyncio.sleep(RETRY_PAUSE_S * 2 ** attempt)
                except BackPressureError:
                    await send_json(send, 429, error_json(
                        "server busy: every replica is full and the queue before them too; retry shortly, or add "
                        "replicas (--replicas, --max-replicas)", "queue_full", "rate_limit_error"), close=False)
                    return
            await _unavailable(send)
        except RequestCancelledError:
            return  # the client went away
        except Exception:  # a fault in this file or in Ray: the client gets a reference, the log the details
            ref = new_id("err")
            log.exception("unhandled error %s", ref)
            message = f"internal server error (reference {ref} in the server log)"
            if not sent:
                await send_json(send, 500, error_json(message, "internal_error", "server_error"), close=False)
            elif head is not None and head[3]:
                event = json.dumps(error_body(message, "server_error"), separators=(",", ":")).encode()
                await send({"type": "http.response.body", "body": b"data: " + event + b"\n\ndata: [DONE]\n\n",
                            "more_body": False})
        except asyncio.CancelledError:
            if gen is not None:
                gen.cancel()  # the replica's app sees a disconnect and frees the request's rows
            raise


async def _unavailable(send: Send) -> None:
    body = error_json(f"no replica could take this request after {ATTEMPTS} tries (replicas are being replaced); "
                      f"retry after {RETRY_AFTER_S} s", "replica_unavailable", "server_error")
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"retry-after", str(RETRY_AFTER_S).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive) -> Optional[bytes]:
    """The whole body (BodyLimit has bounded a POST's already); None if the client went away first."""
    chunks: list[bytes] = []
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            return b"".join(chunks)


def build_application(args: argparse.Namespace, config: ServerConfig, rc: RayConfig) -> Any:
    """The Serve application: ``rc``'s replicas of ``serve``'s flags ``args``, behind one front."""
    threads = config.threads or 1
    # the key travels in the replicas' environment, where build_state reads it as `serve` does; a key file's
    # path may not exist on another node, and a key among the flags would be logged as visible in `ps`
    replica_args = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "func"})
    replica_args.api_key = replica_args.api_key_file = None
    replica_args.threads = threads
    env = {"SPECDECODE_API_KEY": config.api_key or "", "OMP_NUM_THREADS": str(threads)}
    autoscaling = None
    if rc.autoscaling:
        autoscaling = {"min_replicas": rc.min_replicas, "max_replicas": rc.max_replicas,
                       "initial_replicas": rc.initial_replicas,
                       # a replica with every row busy and more waiting is the pressure that calls for another
                       "target_ongoing_requests": config.max_batch_size,
                       "upscale_delay_s": UPSCALE_DELAY_S, "downscale_delay_s": DOWNSCALE_DELAY_S}
    core = serve.deployment(
        name=CORE, num_replicas=None if rc.autoscaling else rc.initial_replicas,
        autoscaling_config=autoscaling, ray_actor_options={"num_cpus": threads, "runtime_env": {"env_vars": env}},
        # a replica takes what `serve` takes (its rows and its queue; past them it answers 429 itself), so
        # Ray's router only waits while every replica is full: during a failover or a scale-up
        max_ongoing_requests=config.max_batch_size + config.max_queue, max_queued_requests=config.max_queue,
        graceful_shutdown_timeout_s=config.drain_timeout, graceful_shutdown_wait_loop_s=1.0, logging_config=RAY_LOGGING,
    )(DecodeReplica).bind(replica_args, threads)
    limits = FrontLimits(config.host, config.allowed_hosts, config.api_key is not None, config.max_body_bytes,
                         rc.initial_replicas)
    front = serve.deployment(name=FRONT, num_replicas=1, ray_actor_options={"num_cpus": 0},
                             max_ongoing_requests=config.max_connections, logging_config=RAY_LOGGING,
                             )(serve.ingress()(Front))
    return front.bind(core, limits)


def serve_on_ray(args: argparse.Namespace, config: ServerConfig, rc: RayConfig, startup_timeout: float = 900.0) -> int:
    """Start (or join) a Ray cluster, run the application on --host/--port, and stop it on SIGINT/SIGTERM."""
    threads = config.threads or 1
    address = rc.ray_address or os.environ.get("RAY_ADDRESS")  # Ray's own way to name a cluster
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # the driver's "app is ready" lines: we print our own
    if address is None:
        wanted = (rc.max_replicas or rc.initial_replicas) * threads
        if wanted > (os.cpu_count() or 1):
            log.warning("%d replicas x %d threads ask for more CPUs than this machine has (%d); they will share "
                        "the cores", rc.max_replicas or rc.initial_replicas, threads, os.cpu_count() or 1)
        ray.init(num_cpus=max(os.cpu_count() or 1, wanted), include_dashboard=False,
                 object_store_memory=LOCAL_OBJECT_STORE_BYTES, logging_level=logging.WARNING)
    else:
        ray.init(address=address, logging_level=logging.WARNING)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        try:
            serve.start(http_options={"host": config.host, "port": config.port}, proxy_location="HeadOnly",
                        logging_config=RAY_LOGGING)
        except ray.exceptions.RayTaskError as e:  # Ray's proxy could not listen: say which flag to change
            if "Failed to bind" not in str(e):
                raise
            raise CLIError(f"cannot listen on {config.host}:{config.port} (in use?); pick another --port") from None
        try:
            serve.run(build_application(args, config, rc), name=APP_NAME, route_prefix="/")
        except RuntimeError as e:  # a replica's constructor raised: Ray has logged its traceback above
            if "Deploying application" not in str(e):
                raise
            raise CLIError(f"the replicas could not start: {e} (their error is in the lines above)") from None
        front = serve.get_deployment_handle(FRONT, APP_NAME)
        deadline = time.monotonic() + startup_timeout
        while True:  # ready once every replica has reported (each has loaded and listens)
            _, body = front.health.remote().result()
            if body.get("replicas_live", 0) >= rc.initial_replicas or stop.is_set():
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the replicas did not all report within {startup_timeout:.0f} s")
            time.sleep(0.5)
        scaling = (f"{rc.min_replicas}-{rc.max_replicas} replicas on queue depth" if rc.autoscaling
                   else f"{rc.initial_replicas} replicas")
        print(f"specdecode serve --ray: {body.get('model')} on http://{config.host}:{config.port}/ ({scaling}, "
              f"{threads} thread(s) each; drafter {body.get('default_drafter')}; Ray at "
              f"{address or 'a local cluster'})", flush=True)
        stop.wait()
        print("specdecode serve --ray: stopping (running requests get --drain-timeout)", flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
