"""Callback deliveries: what is delivered, how it is signed, when it is retried, and its state in Redis.

A delivery is a member of ``keys.CALLBACKS_DUE`` (its id, ``t:<task id>:<seq>:<STATUS>`` or
``b:<batch id>:0:DONE``), scored by the ms it is next due. The transition scripts add it and set its target's
callback state to pending; from there:

1. the scheduler's tick (workers.delivery) *claims* what is due (:data:`CLAIM`: its score moves to now + a
   lease, in one step, so two schedulers never enqueue the same attempt) and enqueues one job per delivery,
   naming the claim (the score it set);
2. the job *takes* its claim (:data:`TAKE`: only while the score is still that claim's, moving it to now + the
   attempt's lease), so a job enqueued again after its lease ran out, or twice, makes no second attempt; a
   delivery whose worker died is claimed again when its lease runs out;
3. its first attempt writes the delivery's record (``keys.delivery``: the URL, the member, the body, the
   first attempt's time), so every retry sends the same bytes;
4. after each attempt :data:`SETTLE` records the outcome on the target (its callback state, attempts and last
   status, a new event for its watchers) and either schedules the next attempt (:func:`next_attempt`) or ends
   the delivery (delivered, or failed past TASKPORT_CALLBACK_MAX_AGE): record dropped, member removed.

At least once: an attempt whose answer was lost is made again with the same ``webhook-id`` (the delivery's id),
which is what a receiver deduplicates on. Each attempt is signed afresh (:func:`signed_headers`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import redis
from standardwebhooks import Webhook

from app.core import keys
from app.core.config import Config
from app.core.keys import BatchField, DeliveryField, TaskField
from app.core.lua import FIRST, LATE, Script
from app.core.states import TERMINAL, TaskStatus
from app.core.states import CallbackState as CallbackState  # re-exported: a delivery's states

# The statuses a callback may be asked for (a submit's ``callback.events``, all of them by default).
EVENTS: tuple[str, ...] = tuple(s.value for s in TaskStatus if s in TERMINAL or s == TaskStatus.EXPIRED)
BATCH_EVENT = "DONE"  # a batch's one delivery, when it is first done
# Seconds before the retry after attempt 1, 2, 3...; the last one repeats (unit tests patch it).
BACKOFF: tuple[int, ...] = (1, 5, 30, 120, 600, 1800, 3600)
CLAIM_LEASE_MS = 60_000  # a claimed delivery whose job has not started within this is claimed (enqueued) again
ATTEMPT_GRACE_MS = 30_000  # the attempt's lease: the job's timeout (see job_timeout) and this much more
RECORD_GRACE_S = 3600  # a record outlives TASKPORT_CALLBACK_MAX_AGE by this much at most (should no one end it)
RESOLVE_ALLOWANCE_S = 30  # seconds a job may spend resolving a host (the resolver's own retries) over its timeout



@dataclass(frozen=True)
class Kind:
    """What a delivery's target is: a task (``t``) or a batch (``b``), its hash, its event channel, its fields."""

    hash_key: Callable[[str], str]
    channel: Callable[[str], str]
    url: str
    member: str
    state: str
    attempts: str
    last_status: str
    seq: str


TASK, BATCH = "t", "b"
KINDS = {
    TASK: Kind(keys.task, keys.events, TaskField.CALLBACK_URL, TaskField.MEMBER, TaskField.CALLBACK_STATE,
               TaskField.CALLBACK_ATTEMPTS, TaskField.CALLBACK_LAST_STATUS, TaskField.SEQ),
    BATCH: Kind(keys.batch, keys.batch_events, BatchField.CALLBACK_URL, BatchField.MEMBER, BatchField.CALLBACK_STATE,
                BatchField.CALLBACK_ATTEMPTS, BatchField.CALLBACK_LAST_STATUS, BatchField.SEQ),
}


class DeliveryId(NamedTuple):
    """A delivery's id (a member of ``keys.CALLBACKS_DUE``) in its parts."""

    kind: str
    target: str  # the task's or the batch's id
    seq: int
    event: str  # the status the task entered, or BATCH_EVENT

    @classmethod
    def parse(cls, text: str) -> DeliveryId | None:
        kind, _, rest = text.partition(":")
        target, seq, event = (rest.rsplit(":", 2) + ["", ""])[:3]
        if kind not in KINDS or not target or not seq.isdigit() or event not in (*EVENTS, BATCH_EVENT):
            return None
        return cls(kind, target, int(seq), event)

    def __str__(self) -> str:
        return f"{self.kind}:{self.target}:{self.seq}:{self.event}"


class Record(NamedTuple):
    """A delivery's record (``keys.delivery``), written at its first attempt."""

    url: str
    member: str
    body: bytes
    first_at: int  # ms
    attempts: int


def retry_delay(attempts: int) -> int:
    """Seconds from a failed attempt (the ``attempts``-th) to the next one: :data:`BACKOFF`, its last step repeated."""
    return BACKOFF[min(max(attempts, 1), len(BACKOFF)) - 1]


def next_attempt(first_at: int, now: int, attempts: int, max_age_s: int) -> int | None:
    """The ms of the attempt after a failed one (the ``attempts``-th, made at ``now``), or None when that would
    fall more than ``max_age_s`` after the first attempt: the delivery is given up."""
    at = now + retry_delay(attempts) * 1000
    return at if at <= first_at + max_age_s * 1000 else None


def job_timeout(timeout_s: float) -> int:
    """Seconds an attempt's job may run (RQ's job timeout): the request's deadline, and time to resolve its host."""
    return int(timeout_s) + 1 + RESOLVE_ALLOWANCE_S


def signed_headers(secret: str, webhook_id: str, body: bytes, at_s: int) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt at ``at_s`` (seconds since the epoch), signed with the
    member's ``secret`` (``whsec_...``) by the standardwebhooks library itself, so a receiver's verify agrees."""
    signature = Webhook(secret).sign(webhook_id, datetime.fromtimestamp(at_s, UTC), body.decode())
    return {"webhook-id": webhook_id, "webhook-timestamp": str(at_s), "webhook-signature": signature,
            "Content-Type": "application/json"}


_FIELD = re.compile(r"%([a-z_]+)")


def _fields(body: str) -> str:
    """``%name`` markers as the DeliveryField they name (an unknown name fails at import)."""
    return _FIELD.sub(lambda m: f"'{DeliveryField(m[1]).value}'", body)


# The due deliveries (at most ``limit``), each moved to ``until_ms`` in the same step: what one scheduler claims,
# no other sees as due until that lease runs out. Returns their ids.
CLAIM = Script(
    "callbacks_claim",
    once=LATE,
    keys={"due": "sorted set: delivery id -> ms it is due"},
    args={"now_ms": "now", "until_ms": "the claim's lease: when it is due again if no job takes it",
          "limit": "how many to claim at most"},
    body="""
local found = redis.call('ZRANGEBYSCORE', due, '-inf', now_ms, 'LIMIT', 0, tonumber(limit))
for _, id in ipairs(found) do redis.call('ZADD', due, 'XX', until_ms, id) end
return found
""")

# A job takes its claim: only while the delivery is still due at the claim's score (not claimed again since, nor
# settled), moving it to ``until_ms`` (the attempt's lease). Returns 1 when taken, 0 otherwise.
TAKE = Script(
    "callbacks_take",
    once=LATE,
    keys={"due": "sorted set: delivery id -> ms it is due"},
    args={"delivery_id": "the delivery", "claim_ms": "the score the claim set", "until_ms": "the attempt's lease"},
    body="""
local score = redis.call('ZSCORE', due, delivery_id)
if not score or tonumber(score) ~= tonumber(claim_ms) then return 0 end
redis.call('ZADD', due, 'XX', until_ms, delivery_id)
return 1
""")

# An attempt's outcome: on the target, while its hash exists, its callback state, attempts and last status, and a
# new event (seq bumped and published) for its watchers; then the next attempt at ``next_ms`` (the record keeps
# the attempts), or with next_ms '' the end of the delivery (record dropped, out of the due set).
SETTLE = Script(
    "callbacks_settle",
    once=FIRST,
    keys={"target": "hash: the task's or batch's record", "channel": "channel: its events",
          "record": "hash: the delivery's record", "due": "sorted set: delivery id -> ms it is due"},
    args={"delivery_id": "the delivery", "state": "the target's callback state now",
          "attempts": "attempts made so far", "last_status": "the last attempt's HTTP status ('' = none)",
          "next_ms": "when the next attempt is due ('' = none: the delivery ends)",
          "state_field": "the target's field of its callback state", "attempts_field": "of its callback attempts",
          "status_field": "of its last callback status", "seq_field": "of its event sequence number"},
    body=_fields("""
if redis.call('EXISTS', target) == 1 then
  redis.call('HSET', target, state_field, state, attempts_field, attempts, status_field, last_status)
  redis.call('PUBLISH', channel, redis.call('HINCRBY', target, seq_field, 1))
end
if next_ms == '' then
  redis.call('DEL', record)
  redis.call('ZREM', due, delivery_id)
else
  redis.call('HSET', record, %attempts, attempts)
  redis.call('ZADD', due, 'XX', next_ms, delivery_id)
end
return 1
"""))

SCRIPTS = (CLAIM, TAKE, SETTLE)


class Deliveries:
    """The due set and the delivery records: every read and write of them goes through here."""

    def __init__(self, conn: redis.Redis, record_ms: int | None = None) -> None:
        self.redis: Any = conn  # replies are bytes (no decoding)
        self.record_ms = Config().call_record_ms if record_ms is None else record_ms  # lua.ONCE_KEY
        self._scripts = {s.name: conn.register_script(s.source()) for s in SCRIPTS}

    def _run(self, script: Script, keys_: dict[str, str], args: dict[str, Any]) -> Any:
        names, values = script.call(keys_, args, record_ms=self.record_ms)
        return self._scripts[script.name](keys=[*names, keys.AUDIT], args=values)  # AUDIT: every script's last

    def claim(self, now: int, limit: int) -> tuple[list[str], int]:
        """Claim up to ``limit`` deliveries due at ``now``: (their ids, the claim's score)."""
        until = now + CLAIM_LEASE_MS
        found = self._run(CLAIM, {"due": keys.CALLBACKS_DUE}, {"now_ms": now, "until_ms": until, "limit": limit})
        return [i.decode() for i in found], until

    def take(self, delivery_id: str, claim: int, until: int) -> bool:
        """Take the claim ``claim`` on the delivery for an attempt leased until ``until`` (see :data:`TAKE`)."""
        args = {"delivery_id": delivery_id, "claim_ms": claim, "until_ms": until}
        return bool(self._run(TAKE, {"due": keys.CALLBACKS_DUE}, args))

    def record(self, delivery_id: str) -> Record | None:
        h = self.redis.hgetall(keys.delivery(delivery_id))
        if not h:
            return None
        g = {k.decode(): v for k, v in h.items()}
        return Record(g[DeliveryField.URL].decode(), g[DeliveryField.MEMBER].decode(), g[DeliveryField.BODY],
                      int(g[DeliveryField.FIRST_AT]), int(g.get(DeliveryField.ATTEMPTS) or 0))

    def open(self, delivery_id: str, record: Record, max_age_s: int) -> None:
        """Write the record of a delivery's first attempt (it expires should nothing ever end it)."""
        key = keys.delivery(delivery_id)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={DeliveryField.URL: record.url, DeliveryField.MEMBER: record.member,
                                    DeliveryField.BODY: record.body, DeliveryField.FIRST_AT: record.first_at,
                                    DeliveryField.ATTEMPTS: record.attempts})
            pipe.expire(key, max_age_s + RECORD_GRACE_S)
            pipe.execute()

    def target(self, did: DeliveryId) -> dict[bytes, bytes]:
        """The target's hash ({} once it is gone)."""
        found: dict[bytes, bytes] = self.redis.hgetall(KINDS[did.kind].hash_key(did.target))
        return found

    def settle(self, did: DeliveryId, state: str, attempts: int, last_status: int | None,
               next_ms: int | None) -> None:
        """Record an outcome (see :data:`SETTLE`); ``next_ms`` None ends the delivery."""
        kind = KINDS[did.kind]
        self._run(SETTLE, {"target": kind.hash_key(did.target), "channel": kind.channel(did.target),
                           "record": keys.delivery(str(did)), "due": keys.CALLBACKS_DUE},
                  {"delivery_id": str(did), "state": state, "attempts": attempts,
                   "last_status": "" if last_status is None else last_status,
                   "next_ms": "" if next_ms is None else next_ms, "state_field": kind.state,
                   "attempts_field": kind.attempts, "status_field": kind.last_status, "seq_field": kind.seq})

    def drop(self, delivery_id: str) -> None:
        """Forget a delivery that cannot be made (its target is gone, or its id is not one)."""
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(keys.CALLBACKS_DUE, delivery_id)
            pipe.delete(keys.delivery(delivery_id))
            pipe.execute()
