"""Failover and host loss on the bed, under a steady submit + poll + SSE load from the client host.

Two web hosts, two worker hosts (two workers and a scheduler each), started as the Procfile starts them
and pointed only at the three Sentinels (tests/scale/cluster.py). Each test prints its figures (the gap,
the 503s, the tasks lost); docs/operations.md quotes them from a run of this file.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import pytest

from app.core import keys
from app.core.audit import EntryField
from app.core.housekeeping_passes import PASSES
from app.core.housekeeping_passes import job_id as pass_job_id
from app.core.states import ErrorCode
from tests.integration.harness import wait_until
from tests.scale.bed import DATA_NODES, Bed, BedError, RemoteError, netns_pids
from tests.scale.cluster import Cluster

LOAD_SECONDS = 24  # seconds of load per test: before, during and after the failure
SETTLE = 90  # seconds the acknowledged tasks get to end after the load
PROMOTION_TIMEOUT = 30.0
TERMINAL_OUTCOME = re.compile(r"task_id=(\S+) .*?(completed$|failed with code)")


def primary_now(bed: Bed) -> str | None:
    with contextlib.suppress(BedError, RemoteError):
        return bed.primary()
    return None


def counter(bed: Bed, field: str) -> int:
    return int(bed.redis(bed.primary())("HGET", keys.STATS, field) or 0)


def restore(bed: Bed) -> None:
    """Every data node up and replicating the current primary (each test starts from a healthy group)."""
    for host in DATA_NODES:
        if not netns_pids(bed.hosts[host].ns):
            bed.restart_redis(host)
    wait_until(lambda: _replicas(bed) == len(DATA_NODES) - 1, timeout=30, interval=0.2,
               message="both replicas in sync with the primary", ignore=(BedError, RemoteError))


def _replicas(bed: Bed) -> int:
    info = bed.redis(bed.primary()).info("replication")
    return sum(1 for k, v in info.items()
               if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online")


def passes_ended_after(bed: Bed, moment: float) -> bool:
    """Every housekeeping pass has ended since ``moment`` (a wall-clock time.time())."""
    remote = bed.redis(bed.primary())
    for name in PASSES:
        ended = remote("HGET", f"rq:job:{pass_job_id(name)}", "ended_at")
        if not ended:
            return False
        when = datetime.strptime(str(ended), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
        if when <= moment:
            return False
    return True


def await_subscribers(bed: Bed, server: str, cluster: Cluster) -> None:
    """Every web host's event hub subscribes on ``server`` (at some moment: a hub holds its subscription
    only while a stream of its process is open)."""
    seen: set[str | None] = set()

    def every_web_host() -> bool:
        seen.update(long_lived_on(bed, server, cluster)[0])
        return set(cluster.web_hosts) <= seen

    wait_until(every_web_host, timeout=15, interval=0.1, ignore=(RemoteError,),
               message=lambda: f"a subscriber from each web host on {server}, seen: {seen}")


def long_lived_on(bed: Bed, server: str, cluster: Cluster) -> tuple[set[str | None], set[str | None]]:
    """The hosts with a subscribed connection on ``server``, and those with a connection blocked in BLPOP
    (workers idle in their dequeue, the housekeeper too)."""
    reply = bed.redis(server)("CLIENT LIST")
    clients = reply if isinstance(reply, list) else [
        dict(part.split("=", 1) for part in line.split() if "=" in part) for line in str(reply).splitlines()]
    ip_of = {bed.hosts[h].ip: h for h in (*cluster.web_hosts, *cluster.worker_hosts)}
    subscribed = {ip_of.get(c["addr"].rsplit(":", 1)[0]) for c in clients if int(c.get("psub", 0)) > 0}
    popping = {ip_of.get(c["addr"].rsplit(":", 1)[0]) for c in clients if c.get("cmd") == "blpop"}
    return subscribed, popping


def outcomes_per_task(cluster: Cluster) -> dict[str, set[str]]:
    """Each task's run outcomes as the workers logged them ("completed" or "failed with code")."""
    seen: dict[str, set[str]] = defaultdict(set)
    for line in cluster.logs("task_id="):
        match = TERMINAL_OUTCOME.search(line)
        if match:
            seen[match.group(1)].add(match.group(2))
    return seen


def _audit(bed: Bed) -> list[dict[str, str]]:
    entries = bed.redis(bed.primary())("XRANGE", keys.AUDIT, "-", "+", timeout=10.0)
    return [dict(zip(e[::2], e[1::2], strict=True)) if isinstance(e, list) else e for _, e in entries]


def audit_outcomes(bed: Bed) -> dict[str, set[str]]:
    """Each task's terminal statuses in the audit stream of the current primary."""
    seen: dict[str, set[str]] = defaultdict(set)
    for fields in _audit(bed):
        if fields.get(EntryField.TO) in ("COMPLETED", "FAILED", "CANCELLED"):
            seen[fields[EntryField.TASK]].add(fields[EntryField.TO])
    return seen


def check_served(result: dict[str, Any]) -> None:
    """What holds in every scenario: no 5xx but 503, every 503 with Retry-After, no request hanging."""
    assert result["server_errors"] == [], result["server_errors"]
    assert result["no_retry_after"] == 0
    # never a hang: a request talking to a primary as it is cut off waits out the Redis timeout (2 s), then a
    # reconnect's connect timeout (1 s) per try, before its 503
    assert result["longest_request_s"] < 5.0, result
    assert result["outcomes"].get("unfinished", 0) == 0, result
    assert result["watch_terminal"] + len(result["lost"]) >= result["watched"], result


@pytest.mark.parametrize("ack", [False, True], ids=["async-replication", "replica-ack"])
def test_primary_killed_under_load(bed: Bed, ack: bool) -> None:
    restore(bed)
    extra = {"TASKPORT_REPLICA_ACK": "1"} if ack else {}
    with Cluster(bed, extra=extra) as cluster:
        done = counter(bed, "completed")  # the stats count since the bed's first test
        load = cluster.load(f"kill-{int(ack)}", duration=LOAD_SECONDS, settle=SETTLE).go()
        wait_until(lambda: counter(bed, "completed") >= done + 50, timeout=30, interval=0.2,
                   message="50 tasks completed before the kill")
        old = bed.primary()
        killed_at, killed_wall = time.monotonic(), time.time()
        bed.kill_host(old)
        new = wait_until(lambda: (p := primary_now(bed)) != old and p, timeout=PROMOTION_TIMEOUT, interval=0.05,
                         message="a replica promoted")
        promoted_s = time.monotonic() - killed_at
        # the web processes' pub/sub (open while their SSE streams are) moves to the new primary
        await_subscribers(bed, new, cluster)
        result = load.result(timeout=LOAD_SECONDS + SETTLE + 30)
        print(f"\n[{'replica-ack' if ack else 'async'}] primary {old} killed, {new} promoted after {promoted_s:.1f} s; "
              f"acknowledged {result['acked']}, outcomes {result['outcomes']}, lost {len(result['lost'])}; "
              f"503s {sum(v for k, v in result['codes'].items() if k.endswith(' 503'))} between "
              f"{result['gap_s']} s of the load; longest request {result['longest_request_s']} s; "
              f"SSE {result['watch_terminal']}/{result['watched']} terminal events")
        check_served(result)
        assert sum(v for k, v in result["codes"].items() if k.endswith(" 503")) > 0  # the gap was there...
        assert result["last_ack_s"] > result["gap_s"][1]  # ...and submits were accepted again after it
        # every run went on through the failover: a heartbeat stuck on the dead primary would have had its
        # task recovered, and demo.sleep has no attempt to spare (FAILED -3)
        assert set(result["outcomes"]) <= {"COMPLETED", "lost"}, result["outcomes"]
        if ack:
            assert result["lost"] == []
        # every long-lived connection followed the promotion: the scheduler's loop and its housekeeper's...
        wait_until(lambda: passes_ended_after(bed, killed_wall + 1), timeout=30, interval=0.2,
                   message="every housekeeping pass ran again after the failover", ignore=(RemoteError,))
        # ...and, on the new primary now that the load is over, every worker host's blocking pops
        wait_until(lambda: long_lived_on(bed, new, cluster)[1] == set(cluster.worker_hosts), timeout=15, interval=0.2,
                   message=lambda: f"blocked pops from each worker host on {new}: {long_lived_on(bed, new, cluster)}")


def test_primary_cut_off_rejoins_as_replica(bed: Bed) -> None:
    restore(bed)
    with Cluster(bed, extra={"TASKPORT_REPLICA_ACK": "1"}) as cluster:
        done = counter(bed, "completed")
        load = cluster.load("cut", duration=LOAD_SECONDS, settle=SETTLE).go()
        wait_until(lambda: counter(bed, "completed") >= done + 50, timeout=30, interval=0.2,
                   message="50 tasks completed before the cut")
        old = bed.primary()
        cut_at = time.monotonic()
        bed.cut(old)
        new = wait_until(lambda: (p := primary_now(bed)) != old and p, timeout=PROMOTION_TIMEOUT, interval=0.05,
                         message="a replica promoted while the primary is cut off")
        promoted_s = time.monotonic() - cut_at
        wait_until(lambda: time.monotonic() - cut_at > 10, timeout=15, interval=0.2,
                   message="10 s of partition (twice the failover timeout)")
        bed.heal(old)
        wait_until(lambda: bed.redis(old).info("replication").get("master_link_status") == "up",
                   timeout=30, interval=0.2, message=f"{old} back as a replica", ignore=(RemoteError,))
        assert bed.redis(old).info("replication")["role"] == "slave"
        result = load.result(timeout=LOAD_SECONDS + SETTLE + 30)
        twice = {t: o for t, o in outcomes_per_task(cluster).items() if len(o) > 1}
        audited = {t: o for t, o in audit_outcomes(bed).items() if len(o) > 1}
        print(f"\n[cut] {old} cut off, {new} promoted after {promoted_s:.1f} s, {old} rejoined as a replica; "
              f"acknowledged {result['acked']}, outcomes {result['outcomes']}, lost {len(result['lost'])}; "
              f"503s between {result['gap_s']} s; tasks run to two outcomes: {len(twice)} (logs), "
              f"{len(audited)} (audit)")
        check_served(result)
        assert result["lost"] == []
        assert twice == {} and audited == {}


def test_web_worker_and_scheduler_hosts_killed(bed: Bed) -> None:
    restore(bed)
    with Cluster(bed) as cluster:
        # tasks of 2 s in 8 steps (a checkpoint each): the four workers are busy when their host dies
        done = counter(bed, "completed")
        load = cluster.load("hosts", duration=LOAD_SECONDS, settle=SETTLE, seconds=2, steps=8, rate=1).go()
        wait_until(lambda: counter(bed, "completed") >= done + 6, timeout=30, interval=0.2,
                   message="6 tasks completed before the kills")
        recovered_before = counter(bed, "recovered")
        bed.kill_host("web1")
        host = housekeeper_host(bed, cluster)
        wait_until(lambda: checkpointed_runs(bed, host), timeout=15, interval=0.05,
                   message=f"a run on {host} past its first checkpoint")
        killed_wall, killed_at = time.time(), time.monotonic()
        bed.kill_host(host)
        wait_until(lambda: passes_ended_after(bed, killed_wall + 1), timeout=30, interval=0.1,
                   message="the surviving scheduler's passes")
        takeover_s = time.monotonic() - killed_at
        result = load.result(timeout=LOAD_SECONDS + SETTLE + 30)
        recovered = counter(bed, "recovered") - recovered_before
        lost_runs = result["outcomes"].get(f"FAILED {ErrorCode.WORKER_LOST}", 0)
        requeued = requeues_per_task(bed)
        print(f"\n[hosts] web1 and {host} (workers + the active scheduler) killed; every pass ran on the other "
              f"scheduler within {takeover_s:.1f} s; acknowledged {result['acked']}, outcomes {result['outcomes']}, "
              f"attempts {result['attempts']}, runs taken over {recovered} (resumed or retried) + {lost_runs} "
              f"(FAILED -3: no checkpoint yet, no attempt left); connections refused by web1 "
              f"{sum(v for k, v in result['refused'].items() if k.startswith(cluster.urls[0]))}")
        check_served(result)
        assert result["lost"] == []
        assert set(result["outcomes"]) <= {"COMPLETED", f"FAILED {ErrorCode.WORKER_LOST}"}, result["outcomes"]
        assert recovered >= 1  # the dead host's checkpointed run was taken over and resumed...
        assert max(requeued.values(), default=0) <= 1  # ...each once: no double recovery by the two schedulers
        assert sum(requeued.values()) == recovered


def requeues_per_task(bed: Bed) -> dict[str, int]:
    """How often each task went from PROCESSING back to PENDING (a recovery: nothing else puts back here)."""
    seen: dict[str, int] = defaultdict(int)
    for fields in _audit(bed):
        if fields.get(EntryField.FROM) == "PROCESSING" and fields.get(EntryField.TO) == "PENDING":
            seen[fields[EntryField.TASK]] += 1
    return seen


def checkpointed_runs(bed: Bed, host: str) -> int:
    """How many tasks run on ``host`` and have saved a checkpoint (so a loss resumes them for free)."""
    remote = bed.redis(bed.primary())
    pids = set(netns_pids(bed.hosts[host].ns))
    count = 0
    for task_id in remote("ZRANGE", keys.RUNNING, 0, -1):
        job, checkpoints, worker = remote("HMGET", keys.task(task_id), keys.TaskField.JOB, keys.TaskField.CHECKPOINTS,
                                          keys.TaskField.WORKER)  # a simple worker's run: the task names it
        worker = worker or remote("HGET", f"rq:job:{job or task_id}", "worker_name")  # a fork or spawn worker's
        pid = remote("HGET", f"rq:worker:{worker}", "pid") if worker else None
        count += bool(pid and int(pid) in pids and int(checkpoints or 0) > 0)
    return count


def housekeeper_host(bed: Bed, cluster: Cluster) -> str:
    """The worker host whose housekeeper ran the latest housekeeping pass (the "active" scheduler)."""
    remote = bed.redis(bed.primary())
    worker = remote("HGET", f"rq:job:{pass_job_id(PASSES[0])}", "worker_name")
    pid = int(remote("HGET", f"rq:worker:{worker}", "pid"))
    return next(h for h in cluster.worker_hosts if pid in netns_pids(bed.hosts[h].ns))
