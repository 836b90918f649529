"""Who syncs which trial files, and when: Storage, Every, the learner's upload before its ack
(`LearnerPorts.before_ack`), SupervisorSync.

The ordering guarantee (checkpoint in the bucket *before* Redis lets go of its groups) is what
makes a resume on another node lossless, so it is checked against a real redis-server and a real
S3 endpoint, including the failure that must leave the groups pending.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import redis

from buffer.connection import RunKeys
from buffer.consumer import RolloutConsumer
from buffer.producer import RolloutProducer
from contract.layout import (
    CHECKPOINTS_DIR,
    METRICS_DIR,
    PROMPTS_FILE,
    RESOLVED_CONFIG,
    TRIAL_JSON,
    TRIALS_DIR,
    WEIGHTS_DIR,
)
from harness.storage.remote_tree import RemoteTree, join_uri
from harness.storage.trial_storage import (
    ENV_SCRATCH,
    ENV_SYNC_S,
    ENV_TRIAL,
    ENV_URI,
    LEARNER_FILES,
    Every,
    Storage,
    SupervisorSync,
    TrialSync,
)
from learner.runtime.resume import commit_groups
from learner.runtime.task import LearnerPorts
from tests.buffer.factories import RUN_ID, make_group
from tests.buffer.run_state import is_trained
from tests.s3 import S3Server

KEYS = RunKeys(RUN_ID)
TRIAL = "trial-a"


def read_remote(tree: RemoteTree, rel: str) -> bytes:
    with tree.fs.open_input_stream(f"{tree.base}/{rel}") as stream:
        return stream.readall()


def write(root: Path, rel: str, data: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data)
    return path


def trial_tree(uri: str, trial: str = TRIAL) -> RemoteTree:
    """The bucket's copy of a trial, opened independently of the code under test."""
    return RemoteTree.open(join_uri(uri, TRIALS_DIR, trial))


# ---- Storage and Every --------------------------------------------------------------------------


def test_env_round_trips_through_from_env(tmp_path: Path) -> None:
    """Components learn where the bucket is only from the environment their host passes on."""
    storage = Storage("s3://k:s@bucket/exp?region=x", tmp_path / "scratch", sync_interval_s=2.5)
    env = storage.env()
    assert set(env) == {ENV_URI, ENV_SCRATCH, ENV_SYNC_S}
    assert Storage.from_env(env) == storage
    assert Storage.from_env({ENV_URI: "s3://b/x", ENV_SCRATCH: "/scratch"}) == Storage(
        "s3://b/x", Path("/scratch"), 5.0
    )


def test_from_env_without_a_uri_is_none() -> None:
    """No URI means output on a local or shared path: nothing to sync."""
    assert Storage.from_env({}) is None
    assert Storage.from_env({ENV_URI: "", ENV_SCRATCH: "/scratch"}) is None


def test_from_env_reads_the_process_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_URI, "s3://b/exp")
    monkeypatch.setenv(ENV_SCRATCH, str(tmp_path))
    monkeypatch.delenv(ENV_SYNC_S, raising=False)
    assert Storage.from_env() == Storage("s3://b/exp", tmp_path)


def test_working_copies_of_two_experiments_never_share_a_directory(tmp_path: Path) -> None:
    """Two experiments (or the same name in two buckets) on one machine must not mix files."""
    a = Storage("s3://bucket-a/exp", tmp_path)
    b = Storage("s3://bucket-b/exp", tmp_path)
    assert a.key != b.key
    assert a.driver_dir() != b.driver_dir()
    assert a.driver_dir().is_relative_to(tmp_path) and b.driver_dir().is_relative_to(tmp_path)
    assert Storage("s3://bucket-a/exp", tmp_path / "elsewhere").key == a.key  # stable


def test_component_dir_is_private_per_node(tmp_path: Path) -> None:
    """A component retried on another node starts from the bucket, even on a shared disk."""
    storage = Storage("s3://b/exp", tmp_path)
    on_one = storage.component_dir(TRIAL, "learner", "node-1")
    on_two = storage.component_dir(TRIAL, "learner", "node-2")
    assert on_one != on_two
    assert storage.component_dir(TRIAL, "generator-0", "node-1") != on_one
    assert storage.component_dir("trial-b", "learner", "node-1") != on_one
    assert on_one.is_relative_to(tmp_path / storage.key)
    assert not on_one.is_relative_to(storage.driver_dir())


def test_every_is_due_once_per_interval() -> None:
    """Periodic syncs in a poll loop: the first call syncs, the next ones within the interval
    do not (a poll every 100 ms must not list the bucket every 100 ms)."""
    every = Every(60.0)
    assert every.due()
    assert not every.due()
    assert not every.due()
    always = Every(0.0)
    assert always.due() and always.due()


# ---- upload before ack (learner.runtime.resume.commit_groups) ---------------------------------


def pending(client: redis.Redis) -> int:
    return int(client.xinfo_groups(KEYS.stream)[0]["pending"])


def take_two(producer: RolloutProducer, buffer: RolloutConsumer) -> list:
    for prompt in range(2):
        producer.push(make_group(prompt), batch_index=0)
    return buffer.take_batch(0, 2, consumer="learner", timeout_s=2)


def uploading_ports(consumer: RolloutConsumer, sync: TrialSync) -> LearnerPorts:
    """The learner's ports of a trial synced to a bucket, as `harness.trial.learner_main` builds
    them: the commit's first step pushes the learner's files."""
    unused = object()
    return LearnerPorts(
        consumer, unused, unused, unused, unused, before_ack=partial(sync.push, LEARNER_FILES)
    )  # type: ignore[arg-type]


def test_commit_uploads_the_checkpoint_then_acks(
    producer: RolloutProducer,
    consumer: RolloutConsumer,
    client: redis.Redis,
    s3_uri: str,
    tmp_path: Path,
) -> None:
    """After a commit, Redis has let go of the groups, so the bucket must already hold the
    checkpoint that records them: a resume elsewhere then neither loses nor repeats them."""
    local = tmp_path / TRIAL
    storage = Storage(s3_uri, tmp_path / "scratch")
    ports = uploading_ports(consumer, TrialSync(storage, TRIAL, local))
    deliveries = take_two(producer, consumer)
    assert pending(client) == 2
    write(local, f"{CHECKPOINTS_DIR}/latest.json", '{"step": 1}')
    write(local, f"{METRICS_DIR}/part-000001.parquet", "metrics")

    commit_groups(ports, deliveries)

    bucket = trial_tree(s3_uri)
    assert read_remote(bucket, f"{CHECKPOINTS_DIR}/latest.json") == b'{"step": 1}'
    assert bucket.exists(f"{METRICS_DIR}/part-000001.parquet")
    assert pending(client) == 0
    assert consumer.depth() == 0
    assert all(is_trained(client, d.group.group_id) for d in deliveries)


def test_failed_upload_leaves_the_groups_pending(
    producer: RolloutProducer,
    consumer: RolloutConsumer,
    client: redis.Redis,
    s3_server: S3Server,
    tmp_path: Path,
) -> None:
    """The ordering itself: if the checkpoint cannot reach the bucket, the commit fails and
    Redis keeps the groups pending, to be redelivered to the learner that resumes."""
    local = tmp_path / TRIAL
    storage = Storage(s3_server.uri("no-such-bucket-xyz", "exp"), tmp_path / "scratch")
    ports = uploading_ports(consumer, TrialSync(storage, TRIAL, local))
    deliveries = take_two(producer, consumer)
    write(local, f"{CHECKPOINTS_DIR}/latest.json", '{"step": 1}')

    with pytest.raises(OSError, match="bucket"):
        commit_groups(ports, deliveries)

    assert pending(client) == 2
    assert consumer.depth() == 2
    assert not any(is_trained(client, d.group.group_id) for d in deliveries)


# ---- TrialSync ----------------------------------------------------------------------------------


def test_trial_sync_for_component_needs_env_and_trial(
    s3_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A component syncs only when its host gave it a private working copy (URI and trial)."""
    monkeypatch.setenv(ENV_URI, s3_uri)
    monkeypatch.setenv(ENV_SCRATCH, str(tmp_path / "scratch"))
    monkeypatch.delenv(ENV_TRIAL, raising=False)
    assert TrialSync.for_component(tmp_path / "copy") is None

    monkeypatch.setenv(ENV_TRIAL, TRIAL)
    sync = TrialSync.for_component(tmp_path / "copy")
    assert sync is not None and sync.trial == TRIAL
    write(tmp_path / "copy", "logs/learner.log", "hello")
    assert sync.push(["logs"]) == ["logs/learner.log"]
    assert trial_tree(s3_uri).exists("logs/learner.log")

    monkeypatch.delenv(ENV_URI)
    assert TrialSync.for_component(tmp_path / "copy") is None


def test_trial_sync_push_now_and_then_is_rate_limited(s3_uri: str, tmp_path: Path) -> None:
    """Progress pushes in the learner loop happen at most once per sync interval."""
    local = tmp_path / TRIAL
    sync = TrialSync(Storage(s3_uri, tmp_path / "scratch", sync_interval_s=60.0), TRIAL, local)
    write(local, "metrics.parquet/part-000001.parquet", "1")
    sync.push_now_and_then([METRICS_DIR])
    write(local, "metrics.parquet/part-000002.parquet", "2")
    sync.push_now_and_then([METRICS_DIR])  # within the interval: not pushed
    assert set(trial_tree(s3_uri).listing()) == {"metrics.parquet/part-000001.parquet"}


# ---- SupervisorSync -----------------------------------------------------------------------------


def test_supervisor_sync_none_does_nothing(tmp_path: Path) -> None:
    """Output on a local path: the supervisor's hooks must be harmless no-ops."""
    sync = SupervisorSync.none()
    assert sync.sync is None
    assert sync.component_env() == {}
    for hook in (lambda: sync.prepared(resume=False), sync.tick, sync.learner_exited):
        hook()
    sync.finished()
    assert list(tmp_path.iterdir()) == []


def test_for_trial_without_storage_env_is_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_URI, raising=False)
    sync = SupervisorSync.for_trial(tmp_path / TRIAL, private_components=True)
    assert sync.sync is None and not sync.private_components
    assert sync.component_env() == {}


@pytest.fixture
def trial_dir(tmp_path: Path, s3_uri: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The supervisor's working copy of a trial, with the storage env a driver would set."""
    monkeypatch.setenv(ENV_URI, s3_uri)
    monkeypatch.setenv(ENV_SCRATCH, str(tmp_path / "scratch"))
    monkeypatch.setenv(ENV_SYNC_S, "60")
    root = tmp_path / "exp" / TRIALS_DIR / TRIAL
    root.mkdir(parents=True)
    return root


def test_component_env_names_the_trial_for_private_components(
    trial_dir: Path, s3_uri: str, tmp_path: Path
) -> None:
    """A component with its own working copy needs the bucket, its scratch dir and its trial."""
    env = SupervisorSync.for_trial(trial_dir, private_components=True).component_env()
    assert env[ENV_TRIAL] == TRIAL
    assert env[ENV_URI] == s3_uri
    assert env[ENV_SCRATCH] == str(tmp_path / "scratch")
    assert Storage.from_env(env) == Storage(s3_uri, tmp_path / "scratch", 60.0)


def test_component_env_is_empty_when_components_share_the_copy(trial_dir: Path) -> None:
    """With the local executor components write the supervisor's copy directly; giving them
    the storage env would make them sync the same files a second time."""
    assert SupervisorSync.for_trial(trial_dir, private_components=False).component_env() == {}


def test_prepared_fresh_forgets_leftovers_and_uploads_supervisor_inputs(
    trial_dir: Path, s3_uri: str
) -> None:
    """A fresh (not resumed) trial must not inherit an earlier attempt's metrics or weights from
    the bucket, and its components (on other nodes) need the trial record, config and prompts
    before they start."""
    bucket = trial_tree(s3_uri)
    bucket.write_bytes(f"{METRICS_DIR}/part-000001.parquet", b"old metrics")
    bucket.write_bytes(f"{WEIGHTS_DIR}/v000001/x", b"old weights")
    bucket.write_bytes(f"{CHECKPOINTS_DIR}/latest.json", b"old checkpoint")
    other_trial = trial_tree(s3_uri, "trial-b")
    other_trial.write_bytes(f"{METRICS_DIR}/part-000001.parquet", b"another trial's")
    write(trial_dir, TRIAL_JSON, '{"name": "trial-a"}')
    write(trial_dir, RESOLVED_CONFIG, "seed: 1\n")
    write(trial_dir, PROMPTS_FILE, "prompts")
    write(trial_dir, f"{METRICS_DIR}/part-000009.parquet", "not the supervisor's to push")

    SupervisorSync.for_trial(trial_dir, private_components=True).prepared(resume=False)

    assert set(bucket.listing()) == {TRIAL_JSON, RESOLVED_CONFIG, PROMPTS_FILE}
    assert read_remote(bucket, TRIAL_JSON) == b'{"name": "trial-a"}'
    assert read_remote(bucket, RESOLVED_CONFIG) == b"seed: 1\n"
    assert set(other_trial.listing()) == {f"{METRICS_DIR}/part-000001.parquet"}


def test_prepared_resume_keeps_the_learners_files(trial_dir: Path, s3_uri: str) -> None:
    """A resumed trial continues from the bucket's checkpoint: it must still be there."""
    bucket = trial_tree(s3_uri)
    bucket.write_bytes(f"{CHECKPOINTS_DIR}/latest.json", b"checkpoint")
    bucket.write_bytes(f"{METRICS_DIR}/part-000001.parquet", b"metrics")
    write(trial_dir, TRIAL_JSON, "{}")

    SupervisorSync.for_trial(trial_dir, private_components=True).prepared(resume=True)

    assert set(bucket.listing()) == {
        f"{CHECKPOINTS_DIR}/latest.json",
        f"{METRICS_DIR}/part-000001.parquet",
        TRIAL_JSON,
    }


def test_finished_with_private_components_pulls_the_learners_progress(
    trial_dir: Path, s3_uri: str
) -> None:
    """The supervisor judges the outcome and `harness run` reports from its own copy, so the
    learner's metrics (written on another node) must be pulled into it at the end; the
    supervisor's own files and the Redis data go up."""
    bucket = trial_tree(s3_uri)
    bucket.write_bytes(f"{METRICS_DIR}/part-000001.parquet", b"step 1")
    bucket.write_bytes(f"{METRICS_DIR}/part-000002.parquet", b"step 2")
    bucket.write_bytes(f"{CHECKPOINTS_DIR}/latest.json", b"not needed by the supervisor")
    write(trial_dir, TRIAL_JSON, '{"status": "done"}')
    write(trial_dir, "redis/appendonly.aof", "aof")

    SupervisorSync.for_trial(trial_dir, private_components=True).finished()

    assert (trial_dir / METRICS_DIR / "part-000001.parquet").read_bytes() == b"step 1"
    assert (trial_dir / METRICS_DIR / "part-000002.parquet").read_bytes() == b"step 2"
    assert not (trial_dir / CHECKPOINTS_DIR).exists()
    assert read_remote(bucket, TRIAL_JSON) == b'{"status": "done"}'
    assert bucket.exists("redis/appendonly.aof")


def test_finished_with_a_shared_copy_pushes_everything(trial_dir: Path, s3_uri: str) -> None:
    """With the local executor the components wrote into this copy: the supervisor publishes
    all of it, but never hidden files such as its lock."""
    write(trial_dir, TRIAL_JSON, "{}")
    write(trial_dir, f"{METRICS_DIR}/part-000001.parquet", "m")
    write(trial_dir, f"{CHECKPOINTS_DIR}/latest.json", "{}")
    write(trial_dir, "logs/learner.log", "log")
    write(trial_dir, ".supervisor.lock", "")

    SupervisorSync.for_trial(trial_dir, private_components=False).finished()

    assert set(trial_tree(s3_uri).listing()) == {
        TRIAL_JSON,
        f"{METRICS_DIR}/part-000001.parquet",
        f"{CHECKPOINTS_DIR}/latest.json",
        "logs/learner.log",
    }


def test_tick_survives_an_unreachable_store(
    s3_server: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A storage outage must not kill the supervisor's poll loop (the learner's own uploads
    are what fail the trial); it warns and tries again later."""
    monkeypatch.setenv(ENV_URI, s3_server.uri("no-such-bucket-xyz", "exp"))
    monkeypatch.setenv(ENV_SCRATCH, str(tmp_path / "scratch"))
    monkeypatch.setenv(ENV_SYNC_S, "0")  # every tick syncs
    trial_dir = tmp_path / TRIAL
    write(trial_dir, TRIAL_JSON, "{}")
    sync = SupervisorSync.for_trial(trial_dir, private_components=False)

    sync.tick()
    sync.tick()

    assert capsys.readouterr().out.count("warning: storage sync failed") == 2
