"""ScriptStore: the base of :class:`app.core.store.TaskStore`, which owns how its writes reach Redis.

It loads the Lua scripts (app.core.scripts' registry, the audit retention rendered in), runs each one through the
one seam every write of the store takes (:meth:`ScriptStore.run_script`: EVALSHA, a caller's pipeline, or the
replica acknowledgement of TASKPORT_REPLICA_ACK), and makes the TRANSITION call that every status change after
the start is (:meth:`ScriptStore._transition`, :meth:`ScriptStore._terminal`). The moves themselves are its
subclasses': a run's in :class:`app.core.runstore.RunStore`, the rest in TaskStore.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from app.core import keys, lua, scripts
from app.core.answers import Transition
from app.core.clock import now_ms
from app.core.config import Config
from app.core.connection import NoReplicaError
from app.core.keys import STAT_ENTERED
from app.core.keys import TaskField as F
from app.core.lua import Command
from app.core.states import RERUNNABLE

REPLICAS_ACKING = 1  # replicas that must have a write before TASKPORT_REPLICA_ACK acknowledges it
LIMIT_KEYS = {"limit_head": keys.LIMIT_HEAD, "limits": keys.LIMITS, "ready": keys.LIMIT_READY}  # limitscripts


class ScriptStore:
    def __init__(self, conn: redis.Redis, config: Config) -> None:
        self.redis: Any = conn  # redis-py's bytes|str unions say nothing here: replies are bytes (no decoding)
        self.config = config
        self._sources = scripts.build(*config.audit_limits)  # the audit retention is rendered into the scripts
        self._scripts = {name: conn.register_script(src) for name, src in self._sources.items()}

    def run_script(self, name: str, keys_: list[str], args: list[Any], client: Any = None, *,
                   acknowledged: bool = False) -> Any:
        """Run a script now (EVALSHA, loading it on NOSCRIPT), or queue it on a caller's pipeline.

        On a pipeline it goes as EVAL with its source: an EVALSHA that met an empty script cache (a
        restarted Redis) would fail inside MULTI while the rest of the transaction still applied, and
        redis-py's own remedy costs a SCRIPT EXISTS round trip on every execute. Every write of the
        store goes through here: the one seam a subclass overrides to send them its own way
        (bench.fill batches them on a pipeline). ``acknowledged``: a caller is told of this write, so
        under TASKPORT_REPLICA_ACK it returns only once a replica has it.
        """
        keys_ = [*keys_, keys.AUDIT]  # every script's last key: lua.AUDIT_STREAM
        if client is not None:
            return client.eval(self._sources[name], len(keys_), *keys_, *args)
        if acknowledged and self.config.replica_ack:
            return self._replicated(name, keys_, args)
        return self._scripts[name](keys=keys_, args=args)

    def _replicated(self, name: str, keys_: list[str], args: list[Any]) -> Any:
        """The script, then WAIT on the same connection (WAIT counts that connection's writes): one round
        trip. A script cache emptied by a failover (the new primary's) gets the script loaded on that same
        pipeline, before the call is repeated (as app.core.connection.SureScript)."""
        sha = self._scripts[name].sha
        for load in (False, True):
            pipe = self.redis.pipeline(transaction=False)
            if load:
                pipe.script_load(self._sources[name])
            pipe.evalsha(sha, len(keys_), *keys_, *args)
            pipe.wait(REPLICAS_ACKING, int(self.config.redis_timeout * 500))  # ms: half the socket timeout
            answer, replicas = pipe.execute(raise_on_error=False)[-2:]
            if not isinstance(answer, redis.exceptions.NoScriptError):
                break
        for reply in (answer, replicas):
            if isinstance(reply, Exception):
                raise reply
        if replicas < REPLICAS_ACKING:
            raise NoReplicaError(f"the write reached {replicas} replicas, TASKPORT_REPLICA_ACK needs {REPLICAS_ACKING}")
        return answer

    def _transition(
        self, task_id: str, expected: tuple[str, ...], new_status: str, fields: list[Any], *,
        run_id: str = "", key_ttl: int | str = "", expiry_ms: int | str = "", result: bytes | str = "",
        drop: str = "", stale_before_ms: int | str = "", stat: str | None = None, client: Any = None,
        refund: bool = False, acknowledged: bool = False, waiting_on: str = "", job: Sequence[Command] = (),
        run_at: int | str = "",
    ) -> Transition:
        """The TRANSITION script (see app.core.scripts); ``job``: the commands that queue the task's RQ job,
        replayed in the same step only when the compare-and-set won; ``run_at``: the task, back to PENDING,
        waits in keys.DELAYED until then (a retry's backoff)."""
        job_keys, job_args = lua.replay(job)
        answer = self.run_script(scripts.TRANSITION.name, *scripts.TRANSITION.call(
            keys={"task": keys.task(task_id), "payload": keys.payload(task_id), "result": keys.result(task_id),
                  "running": keys.RUNNING, "expiry": keys.EXPIRY, "events": keys.events(task_id), "stats": keys.STATS,
                  "failures": keys.FAILURES, "active": keys.ACTIVE, "checkpoint": keys.checkpoint(task_id),
                  "cursor": keys.cursor(task_id), "output": keys.output(task_id), "delayed": keys.DELAYED,
                  "settled": keys.SETTLED,
                  "callbacks_due": keys.CALLBACKS_DUE, "batch_head": keys.BATCH_HEAD,
                  "stored_bytes": keys.STORED_BYTES, "waiting_tasks": keys.WAITING, **LIMIT_KEYS},
            args={"expected": ",".join(expected), "run_id": run_id, "new_status": new_status, "key_ttl_s": key_ttl,
                  "expiry_ms": expiry_ms, "result_json": result, "result_ttl_s": self.config.result_ttl, "drop": drop,
                  "stale_before_ms": stale_before_ms, "now_ms": now_ms(),
                  "stat": STAT_ENTERED.get(new_status, "") if stat is None else stat, "task_id": task_id,
                  "refund": "1" if refund else "", "waiting_on": waiting_on, "job_argc": len(job_args),
                  "run_at_ms": run_at},
            rest_keys=job_keys, rest=[*job_args, *fields], record_ms=self.config.call_record_ms,
        ), client=client, acknowledged=acknowledged)  # fmt: skip
        if client is not None:
            return Transition(True, "")  # queued on a pipeline: the caller reads the answer from execute()
        return Transition(answer[0] == 1, answer[1].decode())

    def _terminal(
        self, task_id: str, expected: tuple[str, ...], status: str, fields: list[Any], *,
        run_id: str = "", result: bytes | str = "", stale_before_ms: int | str = "", waiting_on: str = "",
        job: Sequence[Command] = (),
    ) -> Transition:
        """Any transition into COMPLETED, FAILED or CANCELLED: the result clock starts now. A FAILED or
        CANCELLED task keeps its payload until it expires, so it can run again (app.core.rerun)."""
        c = self.config
        t = now_ms()
        expires = t + c.result_ttl * 1000
        fields = [*fields, F.COMPLETED_AT, t, F.UPDATED_AT, t, F.EXPIRES_AT, expires]
        drop = "checkpoint" if status in RERUNNABLE else "payload"
        return self._transition(
            task_id, expected, status, fields, run_id=run_id, key_ttl=c.result_ttl + c.tombstone_ttl,
            expiry_ms=expires, result=result, drop=drop, stale_before_ms=stale_before_ms, acknowledged=True,
            waiting_on=waiting_on, job=job,
        )


def pairs(flat: list[Any]) -> dict[Any, Any]:
    """A hash from a script's HGETALL reply (a flat list: field, value, ...)."""
    return dict(zip(flat[::2], flat[1::2], strict=True))
