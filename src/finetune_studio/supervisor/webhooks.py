"""The webhook dispatcher: sends the outbox's due deliveries (jobs/webhooks.py), signed
as Standard Webhooks says, in a task of its own.

Nothing on the event path waits for it: a status write only queues rows (in its own
transaction) and wakes this task. Each attempt is signed afresh (`webhook-timestamp`
now; the `webhook-id` is the delivery's, the same on every attempt and after a restart),
has `webhook_timeout_seconds` to be answered, never follows a redirect, and connects
only to an address the outbound rule allows (outbound.py: the name is resolved here and
the connection made to the very address that was checked). A 2xx delivers; anything
else is retried after the next wait of `webhook_retry_seconds` (with jitter); a delivery
whose last attempt fails disables its webhook, saying why. A write of the outcome that
fails (StorageFailed: the health says so) leaves the delivery pending, to be sent again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import random
import socket
import time
from typing import Optional

import httpx

from finetune_studio.config import Settings
from finetune_studio.errors import StorageFailed
from finetune_studio.jobs.counters import Counters
from finetune_studio.jobs.webhooks import Attempt, DueDelivery, WebhookTable
from finetune_studio.outbound import address_problem, name_problem

log = logging.getLogger("finetune_studio.webhooks")
SETTING = "FINETUNE_STUDIO_WEBHOOK_ALLOWED_HOSTS"
# Deliveries sent at once; more wait for the next round.
PARALLEL = 16
# After a failed write of an attempt's outcome, the delivery is not picked again for this long.
RETRY_WRITE_SECONDS = 5.0
USER_AGENT = "finetune-studio-webhooks"


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """Standard Webhooks' `webhook-signature`: `v1,` and the base64 HMAC-SHA256 of
    `{id}.{timestamp}.{body}` under the secret (the base64 after `whsec_`)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


class WebhookDispatcher:
    def __init__(self, table: WebhookTable, settings: Settings, counters: Counters) -> None:
        self.table = table
        self.settings = settings
        self.counters = counters
        self.exposed = not settings.is_loopback()
        self._wake = asyncio.Event()
        self._sending: dict[str, asyncio.Task[None]] = {}
        self._not_before: dict[str, float] = {}  # delivery id -> time.time() (a failed write of its outcome)
        self._task: Optional[asyncio.Task[None]] = None
        self._client = httpx.AsyncClient(
            follow_redirects=False, timeout=settings.webhook_timeout_seconds, trust_env=False,
            headers={"user-agent": USER_AGENT},
        )
        table.on_queued = self._wake.set

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="webhooks")

    async def shutdown(self) -> None:
        """Stop sending; a delivery cut short stays pending and is sent again by the next server."""
        self.table.on_queued = None
        tasks = [task for task in (self._task, *self._sending.values()) if task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._client.aclose()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            now = time.time()
            blocked = set(self._sending) | {key for key, at in self._not_before.items() if at > now}
            try:
                for delivery in self.table.due(now, PARALLEL * 2):
                    if len(self._sending) >= PARALLEL:
                        break
                    if delivery.id in blocked:
                        continue
                    self._not_before.pop(delivery.id, None)
                    self._sending[delivery.id] = asyncio.create_task(self._deliver(delivery), name=f"webhook {delivery.id}")
                    blocked.add(delivery.id)
                next_due = self.table.next_due(exclude=blocked)
            except Exception:  # a read that failed (the data dir went away): look again shortly
                log.exception("webhooks: reading the outbox failed")
                next_due = now + RETRY_WRITE_SECONDS
            # Sleep until a row is queued, a send ends, or the next delivery is due.
            times = [at for at in (next_due, *self._not_before.values()) if at is not None]
            timeout = max(0.01, min(times) - time.time()) if times and len(self._sending) < PARALLEL else None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=timeout)

    async def _deliver(self, delivery: DueDelivery) -> None:
        try:
            attempt = await self._attempt(delivery)
            self._record(delivery, attempt)
        finally:
            self._sending.pop(delivery.id, None)
            self._wake.set()

    async def _attempt(self, delivery: DueDelivery) -> Attempt:
        number = delivery.attempts + 1
        started = time.time()
        clock = time.monotonic()
        status_code: Optional[int] = None
        error: Optional[str] = None
        try:
            status_code, error = await self._send(delivery)
        except httpx.TimeoutException:
            error = f"no answer within {self.settings.webhook_timeout_seconds:g} s (FINETUNE_STUDIO_WEBHOOK_TIMEOUT_SECONDS)"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
        except OSError as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
        return Attempt(number, started, status_code, error, time.monotonic() - clock)

    async def _send(self, delivery: DueDelivery) -> tuple[Optional[int], Optional[str]]:
        """POST the delivery once: (status code, why it failed or None)."""
        problem = name_problem(
            delivery.url, allowed=self.settings.webhook_allowed_hosts, exposed=self.exposed, what="a webhook",
            setting=SETTING,
        )
        if problem:
            Counters.bump(self.counters.webhook_attempts, "refused")
            return None, f"refused: {problem}"
        url = httpx.URL(delivery.url)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(url.host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            return None, f"{url.host} could not be resolved ({exc.strerror or exc})"
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        for address in addresses:  # every address the name has must be allowed, not only the one used
            problem = address_problem(
                url.host, address, allowed=self.settings.webhook_allowed_hosts, exposed=self.exposed,
                setting=SETTING,
            )
            if problem:
                Counters.bump(self.counters.webhook_attempts, "refused")
                return None, f"refused: {problem}"
        body = delivery.payload.encode()
        timestamp = int(time.time())
        host = url.netloc.decode("ascii")
        headers = {
            "host": host,
            "content-type": "application/json",
            "webhook-id": delivery.id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signature(delivery.secret, delivery.id, timestamp, body),
        }
        # To an address checked above (the name is not resolved again), each in turn as a client
        # tries them; TLS still checks the certificate against the name.
        extensions = {"sni_hostname": url.host} if url.scheme == "https" else {}
        for index, address in enumerate(addresses):
            try:
                answer = await self._client.post(
                    url.copy_with(host=address), content=body, headers=headers, extensions=extensions
                )
                break
            except httpx.ConnectError:
                if index == len(addresses) - 1:
                    raise
        await answer.aclose()
        if 200 <= answer.status_code < 300:
            return answer.status_code, None
        if answer.is_redirect:
            where = answer.headers.get("location", "")[:200]
            return answer.status_code, f"HTTP {answer.status_code}: a redirect (to {where!r}), which is not followed"
        return answer.status_code, f"HTTP {answer.status_code}"

    def _record(self, delivery: DueDelivery, attempt: Attempt) -> None:
        waits = self.settings.webhook_retry_seconds
        delivered = attempt.status_code is not None and 200 <= attempt.status_code < 300
        next_at: Optional[float] = None
        disable: Optional[str] = None
        if not delivered and attempt.number <= len(waits):
            jitter = self.settings.webhook_retry_jitter
            next_at = time.time() + waits[attempt.number - 1] * random.uniform(1 - jitter, 1 + jitter)  # noqa: S311 (not a secret)
        elif not delivered:
            hours = (time.time() - delivery.created_at) / 3600
            disable = (
                f"delivery {delivery.id} failed all {attempt.number} attempts over {hours:.1f} h"
                f" (the last: {attempt.error or f'HTTP {attempt.status_code}'})"
            )
        try:
            state = self.table.record_attempt(delivery, attempt, next_at, disable)
        except StorageFailed as exc:
            log.warning("webhooks: the outcome of %s could not be written (%s); it will be sent again", delivery.id, exc)
            self._not_before[delivery.id] = time.time() + RETRY_WRITE_SECONDS
            return
        if not attempt.error or not attempt.error.startswith("refused:"):
            result = "delivered" if delivered else ("failed" if state == "pending" else "exhausted")
            Counters.bump(self.counters.webhook_attempts, result)
        if disable:
            log.warning("webhooks: %s disabled: %s", delivery.webhook_id, disable)

