"""The fault soak on the multi-host bed (issue 29, part 6): the soak's load and checker (tests/soak/load.py,
tests/soak/checker.py) against taskport on the bed, while a seeded nemesis (tests/scale/nemesis.py) kills
and partitions the Redis primary and kills or freezes workers and webs.

- **The cluster** (tests/scale/cluster.py): ``web`` on ``web1`` and ``web2``; two ``worker``s, a
  ``scheduler`` and a ``deliverer`` on ``work1`` and ``work2``; every process pointed at the three Sentinels,
  with ``TASKPORT_REPLICA_ACK=1`` (with asynchronous replication a failover may lose acknowledged writes, as
  docs/operations.md says, and the checks would judge Redis's promise, not taskport's) and one result
  directory for every host (docs/operations.md: "on several machines they must share that directory").
- **The load** runs in a thread of the test moved into the ``client`` host's namespace
  (``netns.run_inside``), over both web hosts; the callback receiver listens on the client host's address.
- **The checks** are the single-host soak's, all of them: every acknowledged task COMPLETED, items counted
  once, one terminal transition in the audit trail, then tasks once after their batch, callbacks delivered
  under one id, export files byte-identical, the once-a-minute schedule fired once per fire time (a fire
  time may pass without a task only while the primary was down or cut off), answers within the contract.
  The soak's faults the bed does not inject here (the reply-dropping proxy, SIGSTOP of Redis, the Ctrl-C of
  a ``taskport up``) are tests/soak's.

``TASKPORT_SCALE_SOAK_SECONDS`` (default 90) is how long the faults go on, ``TASKPORT_SCALE_SOAK_DRAIN``
(default 30) the most the cluster gets to finish afterwards; ``TASKPORT_SOAK_SEED`` replays a run's faults
and load (the seed is printed first); ``TASKPORT_SCALE_SOAK_INTERVAL`` is the mean gap between two ops of
the load (default 1 s). The module's budget in ``make test-scale`` is ~150 s.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter

import redis
from redis.sentinel import Sentinel

from app.core.process import kill_session
from tests.scale.bed import MASTER_NAME, SENTINEL_PORT, SENTINELS, Bed
from tests.scale.cluster import API_KEY, MEMBER, WORKER_HOSTS, Cluster
from tests.scale.nemesis import BedNemesis
from tests.scale.netns import run_inside
from tests.scale.test_failover import restore
from tests.soak.checker import Checker
from tests.soak.load import Load
from tests.soak.test_soak import SCHEDULE, call, check, figures, schedule_first_fire, under_faults, verdict
from tests.unit.test_callbacks import SECRET, Receiver

SECONDS = float(os.environ.get("TASKPORT_SCALE_SOAK_SECONDS", "90"))
DRAIN = float(os.environ.get("TASKPORT_SCALE_SOAK_DRAIN", "30"))
INTERVAL = float(os.environ.get("TASKPORT_SCALE_SOAK_INTERVAL", "1"))
STALL_TIMEOUT = 4.0  # cluster.SETTINGS' TASKPORT_STALL_TIMEOUT
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def settings(bed: Bed) -> dict[str, str]:
    client = bed.hosts["client"].ip
    return {
        "TASKPORT_REPLICA_ACK": "1",
        "TASKPORT_DATA_DIR": str(bed.workdir / "data" / "shared"),
        "TASKPORT_DEDUP_WINDOW": "7200",  # the schedule's fire times stay readable by their dedup keys
        "TASKPORT_CALLBACK_SECRETS": f"{MEMBER}:{SECRET}",
        "TASKPORT_CALLBACK_ALLOW_HOSTS": client,
    }


def test_soak_on_the_bed(bed: Bed) -> None:
    restore(bed)
    seed = int(os.environ.get("TASKPORT_SOAK_SEED") or random.SystemRandom().randrange(2**32))
    print(f"\nsoak on the bed: seed {seed} (TASKPORT_SOAK_SEED={seed} replays it), {SECONDS:.0f} s of faults, "
          f"logs in {bed.workdir / 'logs'}", flush=True)
    run_inside(bed.hosts["client"].ns, lambda: soak(bed, seed))


def soak(bed: Bed, seed: int) -> None:
    """The soak itself, in the client host's namespace."""
    client = bed.hosts["client"].ip
    receiver = Receiver((200,), host=client)
    cluster = Cluster(bed, extra=settings(bed)).start()
    for host in WORKER_HOSTS:
        cluster.procs.append(bed.start_role(host, "deliverer", env=cluster.env(host)))
    try:
        judge(bed, cluster, receiver, seed)
    finally:
        receiver.close()
        for proc in cluster.procs:  # nothing to finish: the checks are done
            kill_session(proc.pid)
            proc.popen.wait()
        cluster.procs.clear()


def judge(bed: Bed, cluster: Cluster, receiver: Receiver, seed: int) -> None:
    for url in cluster.urls:
        call("GET", f"{url}/readyz")
    began = time.monotonic()
    to_wall = time.time() - began  # monotonic -> epoch seconds
    made = call("POST", cluster.urls[0] + "/api/v1/schedules", json=SCHEDULE, headers=AUTH)
    assert made.status_code == 201, made.text
    schedule = made.json()
    load = Load(cluster.urls, receiver.url("/hooks", host=bed.hosts["client"].ip), seed, INTERVAL)
    load.session.headers.update(AUTH)
    nemesis = BedNemesis(random.Random(seed), bed, cluster, STALL_TIMEOUT)
    paused_at = under_faults(load, nemesis, SECONDS)
    call("PATCH", f"{cluster.urls[0]}/api/v1/schedules/{schedule['schedule_id']}", json={"paused": True},
         headers=AUTH)
    faults_took = paused_at - began

    sentinels = [(bed.hosts[name].ip, SENTINEL_PORT) for name in SENTINELS]
    conn: redis.Redis = Sentinel(sentinels, socket_timeout=5).master_for(MASTER_NAME, socket_timeout=5)
    checker = Checker(cluster.urls[0], conn, load.ledger, receiver)
    checker.session.headers.update(AUTH)
    first_ms = schedule_first_fire(schedule)
    fire_times = list(range(first_ms, int((paused_at + to_wall) * 1000) + 1, 60_000))
    outages = [*nemesis.outages, (paused_at - 3, paused_at)]
    drained, fired, created, results = check(conn, checker, schedule["schedule_id"], fire_times, outages, to_wall,
                                             DRAIN, MEMBER)
    report(seed, faults_took, drained, nemesis, load, checker, len(fire_times), fired, created)
    ignored = list(dict.fromkeys(cluster.logs("delivery ignored")))  # the workers of a host share one log
    print(f"soak: {len(ignored)} deliveries ignored by the workers (their task not PENDING on the server read)")
    for line in ignored[:10]:
        print(f"soak:   {line}")
    verdict(results, f"soak on the bed, seed {seed} (TASKPORT_SOAK_SEED={seed} replays it)")


def report(seed: int, faults_took: float, drained: float, nemesis: BedNemesis, load: Load, checker: Checker,
           fire_times: int, fired: dict[int, str | None], created: set[str]) -> None:
    faults: Counter[str] = Counter(event.kind for event in nemesis.events)
    outages = [round(end - start, 1) for start, end in nemesis.outages]
    print(f"\nsoak: seed {seed}: {faults_took:.0f} s of faults, drained in {drained:.0f} s, "
          f"{len(nemesis.events)} faults {dict(faults)}; no primary for {outages} s")
    figures(load, checker, fire_times, fired, created)
