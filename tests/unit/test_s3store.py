"""What only the S3 store has: bounded memory for big files, outages, presigned URLs, configuration."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests
from botocore.stub import Stubber

from app.core.config import Config, ConfigError
from app.core.ids import new_run_id
from app.core.results import LocalResultStore, StoreUnavailable, result_store
from app.core.s3store import PART_SIZE, S3ResultStore
from tests.s3server import S3Server, dead_endpoint, use_s3

MIB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> S3ResultStore:
    use_s3(monkeypatch, s3_server)
    return S3ResultStore(s3_server.new_bucket(), "p", scratch=tmp_path / "scratch")


@pytest.fixture
def down(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> S3ResultStore:
    """A store whose endpoint refuses every connection (one try per call, so the test stays quick)."""
    use_s3(monkeypatch, s3_server, dead_endpoint())
    return S3ResultStore("bucket", "p", scratch=tmp_path / "scratch", timeout=1, attempts=1)


# Runs in a child process so that its peak memory is the store's alone (the S3 server lives in this
# one). Peak = VmHWM, reset after the warm-up through /proc/self/clear_refs (ru_maxrss would carry the
# parent's peak over fork and exec).
ROUND_TRIP = """
import hashlib, json, re, sys, uuid
from pathlib import Path
from app.core.s3store import S3ResultStore

def peak():
    return int(re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024

def reset():
    Path("/proc/self/clear_refs").write_text("5")
    return peak()

store = S3ResultStore(sys.argv[1], "p", scratch=Path(sys.argv[2]))
task_id = str(uuid.uuid4())
with store.writer(task_id, "warm-up.csv") as fh:  # imports, client and connection pool in place
    fh.write(b"x")
chunk, written = bytes(range(256)) * 4096, hashlib.sha256()
base = reset()
with store.writer(task_id, "export.csv") as fh:
    for i in range(50):
        piece = chunk[i:] + chunk[:i]
        fh.write(piece)
        written.update(piece)
grown_by_write = peak() - base
base = reset()
read = hashlib.sha256()
with store.open(task_id, "export.csv") as fh:
    while block := fh.read(1024 * 1024):
        read.update(block)
grown_by_read = peak() - base
print(json.dumps({"task_id": task_id, "same": read.digest() == written.digest(), "write": grown_by_write,
                  "read": grown_by_read, "size": store.info(task_id, "export.csv", "").size}))
"""


def test_a_50_mb_file_round_trips_as_a_multipart_upload_in_bounded_memory(
        s3: S3ResultStore, tmp_path: Path) -> None:
    child = subprocess.run([sys.executable, "-c", ROUND_TRIP, s3.bucket, str(tmp_path / "child")], cwd=ROOT,
                           capture_output=True, timeout=60, check=True)
    out = json.loads(child.stdout)
    assert out["same"] and out["size"] == 50 * MIB
    head = s3.client.head_object(Bucket=s3.bucket, Key=f"p/{out['task_id']}/export.csv")
    assert head["ETag"].strip('"').endswith(f"-{-(-50 * MIB // PART_SIZE)}")  # a multipart ETag counts its parts
    # a part buffer, the part being sent and botocore's handling of it; never the 50 MiB file (measured here:
    # ~22 MiB with 8 MiB parts; 104 MiB when the part size is raised so that the whole file is buffered)
    assert out["write"] < 48 * MIB and out["read"] < 8 * MIB, out


def test_an_unreachable_store_raises_store_unavailable(down: S3ResultStore) -> None:
    task_id = str(uuid.uuid4())
    with pytest.raises(StoreUnavailable):
        with down.writer(task_id, "out.csv") as fh:
            fh.write(b"a,b\n")
    for call in (lambda: down.open(task_id, "out.csv"), lambda: down.info(task_id, "out.csv", ""),
                 lambda: down.task_ids("", 10)):
        with pytest.raises(StoreUnavailable):
            call()
    assert not (down.scratch / task_id).exists()


def test_delete_on_an_unreachable_store_logs_and_returns(down: S3ResultStore, caplog: pytest.LogCaptureFixture) -> None:
    task_id = str(uuid.uuid4())
    with caplog.at_level(logging.WARNING, "app.core.s3store"):
        down.delete(task_id)
    assert f"could not delete the result objects of {task_id}" in caplog.text


def test_a_presigned_url_fetches_the_object_without_credentials(s3: S3ResultStore) -> None:
    task_id = str(uuid.uuid4())
    with s3.writer(task_id, "out.csv") as fh:
        fh.write(b"a,b\n")
    r = requests.get(s3.presign(task_id, "out.csv", 60), timeout=10)
    assert r.status_code == 200 and r.content == b"a,b\n"


def test_task_ids_lists_folders_that_hold_only_an_unfinished_upload(s3: S3ResultStore, s3_server: S3Server) -> None:
    ids = sorted(str(uuid.uuid4()) for _ in range(6))
    for n, task_id in enumerate(ids):  # an upload only (0, 3), an object only (1, 4), both (2, 5)
        if n % 3 != 1:
            s3_server.start_upload(s3.bucket, f"p/{task_id}/run-{new_run_id()}/export.csv")
        if n % 3 != 0:
            with s3.writer(task_id, "out.csv") as fh:
                fh.write(b"1")
    assert s3.task_ids("", 10) == ids
    assert s3.task_ids("", 4) == ids[:4]
    assert s3.task_ids(ids[1], 3) == ids[2:5]
    assert s3.task_ids(ids[4], 3) == ids[5:]
    assert s3.task_ids(ids[5], 3) == []


def test_task_ids_pages_through_a_servers_upload_listing(s3: S3ResultStore) -> None:
    """What AWS S3 answers (moto's server ignores the delimiter and the markers of ListMultipartUploads):
    folders as CommonPrefixes, a page at a time, the next one from NextKeyMarker."""
    ids = sorted(str(uuid.uuid4()) for _ in range(3))
    listing = {"Bucket": s3.bucket, "Prefix": "p/", "Delimiter": "/"}
    with Stubber(s3.client) as stub:
        stub.add_response("list_objects_v2", {"IsTruncated": False, "KeyCount": 0},
                          {**listing, "MaxKeys": 2, "StartAfter": f"p/{ids[0]}/~"})
        for marker, page, more in ((f"p/{ids[0]}/~", ids[1:2], True), (f"p/{ids[1]}/", ids[2:], False)):
            answer = {"IsTruncated": more, "CommonPrefixes": [{"Prefix": f"p/{i}/"} for i in page],
                      "Uploads": [{"Key": "p/stray-upload", "UploadId": "u"}]}
            if more:
                answer["NextKeyMarker"] = f"p/{page[-1]}/"
            stub.add_response("list_multipart_uploads", answer, {**listing, "MaxUploads": 2, "KeyMarker": marker})
        assert s3.task_ids(ids[0], 2) == ids[1:]
        stub.assert_no_pending_responses()


def test_a_later_run_aborts_what_an_earlier_lost_run_left_unfinished(s3: S3ResultStore, s3_server: S3Server) -> None:
    task_id, other = str(uuid.uuid4()), str(uuid.uuid4())
    run = s3.for_run(new_run_id())
    lost, own, others = (f"p/{task_id}/run-{new_run_id()}/export.csv", f"p/{task_id}/run-{run.run_id}/export.csv",
                         f"p/{other}/run-{new_run_id()}/export.csv")
    for key in (lost, own, others):
        s3_server.start_upload(s3.bucket, key)
    run.prune(task_id)
    assert sorted(s3_server.uploads(s3.bucket)) == sorted([own, others])


def test_delete_aborts_every_unfinished_upload_of_the_task(s3: S3ResultStore, s3_server: S3Server) -> None:
    task_id = str(uuid.uuid4())
    for n in range(3):
        s3_server.start_upload(s3.bucket, f"p/{task_id}/run-{new_run_id()}/part-{n}.csv")
    s3.delete(task_id)
    assert s3_server.uploads(s3.bucket) == []


def test_the_configuration_chooses_the_store(tmp_path: Path) -> None:
    local = result_store(Config.from_env({}, data_dir=tmp_path))
    assert isinstance(local, LocalResultStore) and local.root == tmp_path / "results"
    there = result_store(Config.from_env({"TASKPORT_RESULT_STORE": f"file://{tmp_path}/elsewhere"}))
    assert isinstance(there, LocalResultStore) and there.root == tmp_path / "elsewhere"
    s3 = result_store(Config.from_env({"TASKPORT_RESULT_STORE": "s3://bucket/some/prefix/",
                                       "TASKPORT_RESULT_STORE_TIMEOUT": "2.5"}, data_dir=tmp_path))
    assert isinstance(s3, S3ResultStore)
    assert (s3.bucket, s3.prefix, s3.scratch) == ("bucket", "some/prefix/", tmp_path / "scratch")
    assert S3ResultStore("b", "", scratch=tmp_path).prefix == ""


@pytest.mark.parametrize("value", ["s3://", "s3:///prefix", "gs://bucket", "bucket/prefix", "file://"])
def test_a_malformed_store_url_is_a_config_error(value: str) -> None:
    with pytest.raises(ConfigError, match="TASKPORT_RESULT_STORE"):
        Config.from_env({"TASKPORT_RESULT_STORE": value})


@pytest.mark.parametrize(("value", "limits"), [
    ("30d,1000000", (1_000_000, 30 * 86400)), ("5000", (5000, 0)), ("12h", (0, 12 * 3600)),
    ("90m, 10", (10, 5400)), ("45s", (0, 45)),
])
def test_audit_retention_parses(value: str, limits: tuple[int, int]) -> None:
    assert Config.from_env({"TASKPORT_AUDIT_RETENTION": value}).audit_limits == limits


@pytest.mark.parametrize("value", ["0", "0d", "forever", "-5", "7w", "1e9", "²"])
def test_bad_audit_retention_is_a_config_error(value: str) -> None:
    with pytest.raises(ConfigError, match="TASKPORT_AUDIT_RETENTION"):
        Config.from_env({"TASKPORT_AUDIT_RETENTION": value})


# -- resumable writers on S3 (the contract's tests run on both stores) ---------------------------------------


class Stop(Exception):
    pass


@pytest.fixture
def s3parts(s3: S3ResultStore) -> S3ResultStore:
    """Parts of 5 MiB, S3's (and moto's) smallest."""
    s3.part_size = 5 * MIB
    return s3


def stopped_after(s3: S3ResultStore, task_id: str, data: bytes) -> Any:
    """The token of a writer stopped gracefully after writing ``data``."""
    with pytest.raises(Stop), s3.resumable(task_id, "out.csv", keep_on=(Stop,)) as fh:
        fh.write(data)
        token = fh.durable()[1]
        raise Stop
    return token


def test_only_finished_parts_are_durable(s3parts: S3ResultStore) -> None:
    with s3parts.resumable(str(uuid.uuid4()), "out.csv") as fh:
        fh.write(b"x" * (5 * MIB - 1))
        assert fh.durable() == (0, None)  # all of it still in the buffer
        fh.write(b"x")
        size, token = fh.durable()
        assert size == 5 * MIB and list(token) == ["upload", "parts"] and [p[1] for p in token["parts"]] == [5 * MIB]
        fh.write(b"y" * 3 * MIB)
        assert fh.durable()[0] == 5 * MIB


def test_a_token_whose_part_changed_starts_over_and_aborts_that_upload(s3parts: S3ResultStore,
                                                                       s3_server: S3Server) -> None:
    task_id = str(uuid.uuid4())
    data = os.urandom(11 * MIB)
    token = stopped_after(s3parts, task_id, data)
    key = f"p/{task_id}/out.csv"
    s3_server.client().upload_part(Bucket=s3parts.bucket, Key=key, UploadId=token["upload"], PartNumber=2,
                                   Body=b"z" * 5 * MIB)  # not the bytes the token has
    with s3parts.resumable(task_id, "out.csv", token) as fh:
        assert fh.resumed == 0 and s3_server.uploads(s3parts.bucket) == []
        fh.write(data)
    assert s3parts.open(task_id, "out.csv").read() == data


def test_opening_aborts_the_other_unfinished_uploads_of_its_key_only(s3parts: S3ResultStore,
                                                                      s3_server: S3Server) -> None:
    """What a crash before the first cursor save leaves: an upload no token names."""
    task_id = str(uuid.uuid4())
    for key in (f"p/{task_id}/out.csv", f"p/{task_id}/out.csv", f"p/{task_id}/out.csv.bak", "p/other/out.csv"):
        s3_server.start_upload(s3parts.bucket, key)
    token = stopped_after(s3parts, task_id, b"k" * 6 * MIB)
    assert sorted(s3_server.uploads(s3parts.bucket)) == sorted(
        [f"p/{task_id}/out.csv", f"p/{task_id}/out.csv.bak", "p/other/out.csv"])  # the stopped writer's own
    with s3parts.resumable(task_id, "out.csv", token) as fh:
        assert fh.resumed == 5 * MIB
        fh.write(b"k" * MIB)
    assert sorted(s3_server.uploads(s3parts.bucket)) == sorted([f"p/{task_id}/out.csv.bak", "p/other/out.csv"])
    assert s3parts.open(task_id, "out.csv").read() == b"k" * 6 * MIB


def test_a_resumed_upload_given_fewer_bytes_than_it_holds_fails_and_aborts(s3parts: S3ResultStore,
                                                                           s3_server: S3Server) -> None:
    """Never a file with bytes the processor did not write this time: 5 MiB kept, 1 MiB written again."""
    task_id = str(uuid.uuid4())
    token = stopped_after(s3parts, task_id, b"k" * 6 * MIB)
    with pytest.raises(ValueError, match="written again"), s3parts.resumable(task_id, "out.csv", token) as fh:
        fh.resume_at(0)
        fh.write(b"k" * MIB)
    assert s3_server.uploads(s3parts.bucket) == [] and s3_server.keys(s3parts.bucket) == []


def test_a_resumed_upload_keeps_its_token_until_a_part_more_is_finished(s3parts: S3ResultStore) -> None:
    task_id = str(uuid.uuid4())
    token = stopped_after(s3parts, task_id, b"a" * 6 * MIB)
    with pytest.raises(Stop), s3parts.resumable(task_id, "out.csv", token, keep_on=(Stop,)) as fh:
        fh.resume_at(5 * MIB - 10)
        assert fh.durable() == (5 * MIB, token)
        fh.write(b"a" * (5 * MIB + 10))
        size, later = fh.durable()
        assert size == 10 * MIB and later["upload"] == token["upload"] and later["parts"][0] == token["parts"][0]
        raise Stop
    with s3parts.resumable(task_id, "out.csv", later) as fh:
        assert fh.resumed == 10 * MIB
        fh.write(b"b")
    assert s3parts.open(task_id, "out.csv").read() == b"a" * 10 * MIB + b"b"
