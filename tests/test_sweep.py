"""jaxflowers.sweep: the device pool, its futures, progress, cancellation and failures (the
worker processes' lifetimes: test_sweep_processes.py; what travels: test_sweep_transfer.py).

Most tests run on both backends (local subprocesses and a local Ray instance started once
per session). Every pool is torn down in a fixture that then checks no worker is left.
"""
from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import numpy as np
import psutil
import pytest
import sweep_jobs
from worker_processes import gone_within, sweep_workers

import jaxflowers as jf
from jaxflowers import sweep
from jaxflowers.sweep import slots as devices
from jaxflowers.sweep.backends.local import LocalBackend

pytestmark = pytest.mark.timeout(150)


# ------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray for the whole session (starting it takes ~10 s on 2 cores)."""
    try:
        import ray
    except ImportError:
        pytest.skip("ray is not installed (pip install 'jaxflowers[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(params=["local", "ray"])
def backend(request) -> str:
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
    return request.param


@pytest.fixture
def make_pool(backend, tmp_path):
    """Build pools on the parametrised backend; afterwards kill them and check that no
    worker process (nor, locally, any other child) is left behind."""
    pools, before = [], {p.pid for p in psutil.Process().children(recursive=True)}

    def make(devices=2, **kwargs) -> sweep.DevicePool:
        pool = sweep.DevicePool(devices, backend=backend, log_dir=tmp_path / "logs", **kwargs)
        pools.append(pool)
        return pool

    try:
        yield make
    finally:
        for pool in pools:
            pool.terminate()
            pool.shutdown(wait=True)
        assert gone_within([p.pid for p in sweep_workers()], 3.0), "sweep workers left behind"
        if backend == "local":
            left = {p.pid for p in psutil.Process().children(recursive=True)} - before
            assert gone_within(left, 3.0), f"child processes left behind: {left}"


def _collect(pool) -> tuple[list, threading.Lock]:
    records, lock = [], threading.Lock()

    def callback(job_index, message):
        with lock:
            records.append((job_index, message, threading.current_thread().name))

    pool.after_each(callback)
    return records, lock


# ------------------------------------------------------------------------------ both backends

def test_submit_queues_fifo_and_fetch_outputs_keeps_order(make_pool):
    pool = make_pool(2)
    assert pool.num_slots == 2
    start = time.monotonic()
    # The first two jobs end 1.5 s apart, so the queued two get their slots one at a time.
    futures = [pool.submit(sweep_jobs.interval, seconds) for seconds in (2.0, 3.5, 1.0)]
    futures.append(pool.submit("sweep_jobs:interval", 1.0))  # a reference works too
    # Non-blocking (like parfeval): a submit that waited for a free slot would take at
    # least one 2 s job. (Ray's first submit exports the task: 1.3 s once on a loaded
    # 2-core machine, so no tighter bound.)
    assert time.monotonic() - start < 2.0, "submit must return at once (like parfeval)"
    assert pool.num_jobs == 4 and all(isinstance(f, cf.Future) for f in futures)
    assert {f.job_index for f in cf.as_completed(futures, timeout=120)} == {0, 1, 2, 3}
    created, starts, ends = sweep.fetch_outputs(futures)  # one list per output
    # Process creation times have 10 ms ticks; two workers launched together may swap by one.
    assert created[2] <= created[3] + 0.01, "queued jobs start in submission order"
    for t in starts:  # at most two jobs (slots) run at any moment
        assert sum(s <= t < e for s, e in zip(starts, ends)) <= 2
    assert min(starts[2:]) >= min(ends[:2]), "queued jobs wait for a free slot"
    assert sweep.fetch_outputs(futures, unpack=False)[0] == (created[0], starts[0], ends[0])


def test_after_each_delivers_every_message_in_order_before_the_future_completes(make_pool):
    pool = make_pool(2)
    records, lock = _collect(pool)
    futures = [pool.submit(sweep_jobs.add, i, 10) for i in range(3)]
    assert sweep.fetch_outputs(futures) == [10, 11, 12]
    with lock:
        by_job = {j: [m["i"] for i, m, _ in records if i == j] for j in range(3)}
        assert by_job == {j: [0, 1, 2] for j in range(3)}
        assert all(m["value"] == m["i"] / 2 for _, m, _ in records)
        assert {name for *_, name in records} == {"sweep-events"}  # a pool thread


def test_messages_sent_before_after_each_are_kept(make_pool):
    pool = make_pool(1)
    assert pool.submit(sweep_jobs.add, 1, 2).result(timeout=120) == 3
    records, lock = _collect(pool)
    deadline = time.monotonic() + 5
    while len(records) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [m["i"] for _, m, _ in records] == [0, 1, 2]


def test_a_relay_gives_late_listeners_every_earlier_message_in_order(make_pool):
    """Jobs submitted before the progress figure exists: a ``Relay`` registered first hands
    each listener attached later every earlier message, then the live ones, in order."""
    from jaxflowers.sweep.events import Relay

    pool = make_pool(1)
    relay = pool.after_each(Relay())
    assert pool.submit(sweep_jobs.add, 1, 2).result(timeout=120) == 3
    early, live = [], []
    relay.after_each(lambda job, message: early.append((job, message.get("i", "-"))))
    assert early == [(0, 0), (0, 1), (0, 2)]  # the add job's three messages, already sent
    relay.after_each(lambda job, message: live.append((job, message.get("i", "-"))))
    relay.seal()
    assert pool.submit(sweep_jobs.add, 2, 2).result(timeout=120) == 4
    assert early == live == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    with pytest.raises(RuntimeError, match="sealed"):
        relay.after_each(print)


def test_cancel_queued_and_running_jobs(make_pool):
    pool = make_pool(1)
    started, pids, states = threading.Event(), {}, []

    @pool.after_each
    def callback(job_index, message):
        if "pid" in message:
            pids.update(message)
            started.set()
        states.append((job_index, message.get("state")))

    running = pool.submit(sweep_jobs.announce_and_sleep, 60, with_child=True)
    queued = pool.submit(sweep_jobs.add, 1, 2)
    dropped = pool.submit(sweep_jobs.add, 2, 2)
    assert dropped.cancel() and dropped.cancelled() and not dropped.running()
    assert started.wait(120) and running.running()
    waiter = threading.Thread(target=cf.wait, args=([running],),
                              kwargs={"return_when": cf.FIRST_COMPLETED})
    waiter.start()  # already waiting when the job is cancelled
    start = time.monotonic()
    assert running.cancel(), "a running job must be cancellable (MATLAB cancel(F))"
    assert running.cancelled() and running.done() and not running.running()
    waiter.join(timeout=1.0)
    assert not waiter.is_alive(), "cancel() must wake a concurrent.futures.wait on the job"
    with pytest.raises(cf.CancelledError):
        running.result(timeout=0)
    assert gone_within([pids["pid"], pids["child"]], 2.0), "job and its child outlive cancel"
    assert time.monotonic() - start < 2.5
    assert queued.result(timeout=120) == 3, "the freed slot runs the next queued job"
    assert running.cancel() and not queued.cancel(), "cancel is idempotent; done is done"
    assert cf.wait([running, queued, dropped], timeout=1).not_done == set()
    assert (2, "cancelled") in states and (0, "cancelled") in states  # for the live plot


def test_failures_fail_only_their_own_job(make_pool):
    pool = make_pool(2)
    records, lock = _collect(pool)
    kinds = ["raise", "exit", "segfault", "oom-killed", "memory"]
    futures = {kind: pool.submit(sweep_jobs.fail, kind) for kind in kinds}
    late = pool.submit(sweep_jobs.announce_and_sleep, 60, timeout=1.0)
    fine = pool.submit(sweep_jobs.add, 1, 1)
    errors = {kind: f.exception(timeout=120) for kind, f in futures.items()}
    for index, (kind, error) in enumerate(errors.items()):
        assert isinstance(error, sweep.JobError) and error.job_index == index, kind
        assert f"about to fail: {kind}" in error.log_tail, (kind, error.log_tail)
        assert str(error).startswith(f"job {index} "), str(error)
    assert errors["raise"].error_type == "ValueError" and "on purpose" in str(errors["raise"])
    assert errors["exit"].exit_code == 3 and "code 3" in str(errors["exit"])
    assert errors["segfault"].signal_name == "SIGSEGV"
    assert errors["oom-killed"].signal_name == "SIGKILL" and "out of memory" in str(
        errors["oom-killed"])
    assert errors["memory"].error_type == "MemoryError"
    timeout = late.exception(timeout=120)
    assert isinstance(timeout, sweep.JobTimeoutError) and isinstance(timeout, TimeoutError)
    assert "job 5 timed out" in str(timeout)
    assert fine.result(timeout=120) == 2, "the pool stays usable"
    with pytest.raises(sweep.JobError, match="^job 0 raised ValueError"):
        sweep.fetch_outputs(list(futures.values()) + [fine])
    with lock:
        failed = {i: m["error"] for i, m, _ in records if m.get("state") == "failed"}
    assert sorted(failed) == [0, 1, 2, 3, 4, 5] and failed[2].startswith("job 2 was killed")


def test_arrays_travel_by_file_and_results_keep_types(make_pool):
    pool = make_pool(2)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    facts, doubled, small = pool.submit(sweep_jobs.arrays, x, scale=2).result(timeout=120)
    assert facts == {"memmap": True, "writeable": False, "dtype": "float32", "shape": [3, 4]}
    assert doubled.dtype == np.float32 and np.array_equal(doubled, x * 2)
    assert small.dtype == np.int16 and small.tolist() == [0, 1, 2]
    platform, values = pool.submit(sweep_jobs.with_jax).result(timeout=120)
    assert platform == "cpu" and isinstance(values, np.ndarray)
    assert values.tolist() == [0.0, 2.0, 4.0, 6.0]


def test_a_jobs_own_python_scripts_find_the_modules_beside_them(make_pool, tmp_path,
                                                                monkeypatch):
    """Workers start with PYTHONSAFEPATH (so no folder's other jaxflowers replaces the
    caller's); the jobs they run see the caller's environment again."""
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    pool = make_pool(1)
    status, output, safe_path = pool.submit(sweep_jobs.run_script_beside_its_module,
                                            str(tmp_path)).result(timeout=120)
    assert (status, output, safe_path) == (0, "found", None)


def test_shutdown_like_the_standard_executors(make_pool):
    pool = make_pool(1)
    running = pool.submit(sweep_jobs.interval, 3.0)
    queued = pool.submit(sweep_jobs.add, 1, 2)
    start = time.monotonic()
    pool.shutdown(wait=False, cancel_futures=True)
    assert time.monotonic() - start < 1.5  # not waiting for the 3 s job
    assert queued.cancelled()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(sweep_jobs.add, 1, 2)
    pool.shutdown(wait=True)
    assert running.done() and len(running.result()) == 3


# ------------------------------------------------------------------------------ local only

def test_submit_rejects_what_cannot_travel(tmp_path):
    def local_function():
        return 1

    with sweep.DevicePool(1, log_dir=tmp_path) as pool:
        with pytest.raises(TypeError, match="lambda"):
            pool.submit(lambda: 1)
        with pytest.raises(TypeError, match="local function"):
            pool.submit(local_function)
        with pytest.raises(TypeError, match=r"argument 'x' is a builtins.object"):
            pool.submit(sweep_jobs.add, 1, x=object())
        with pytest.raises(TypeError, match="dict keys"):
            pool.submit(sweep_jobs.add, {1: 2}, 3)
        with pytest.raises(TypeError, match="object array"):
            pool.submit(sweep_jobs.add, np.array([None]), 3)
        with pytest.raises(TypeError, match="module:function"):
            pool.submit("no_colon_here")
        assert pool.num_jobs == 0
    with pytest.raises(ValueError, match="backend"):
        sweep.DevicePool(1, backend="mpi")


def test_after_each_can_keep_only_some_states(tmp_path):
    with sweep.DevicePool(1, log_dir=tmp_path) as pool:
        kept, everything = [], []
        pool.after_each(lambda job, message: everything.append(message))

        @pool.after_each(states=("validation", "done", "failed"))
        def lines(job, message):
            kept.append((job, message["state"]))

        with pytest.raises(ValueError, match=r"\['epoch'\] are not message states"):
            pool.after_each(print, states=("epoch", "done"))
        futures = [pool.submit(sweep_jobs.report_states, "start", "iteration", "iteration",
                               "validation", "done"), pool.submit(sweep_jobs.fail, "raise")]
        cf.wait(futures, timeout=120)
    assert kept == [(0, "validation"), (0, "done"), (1, "failed")]
    assert len(everything) == 7 and {"mine": True} in everything


def test_gpu_slots_pack_jobs_with_a_memory_fraction(monkeypatch, tmp_path):
    cpu_pool = sweep.DevicePool(1, log_dir=tmp_path / "cpu")
    monkeypatch.setattr(LocalBackend, "gpus", lambda self: ["0", "1"])  # no GPU here
    with sweep.DevicePool("all", jobs_per_device=2, mps=False, warm_workers=False,
                          log_dir=tmp_path) as gpu_pool, cpu_pool:
        assert gpu_pool.num_slots == 4
        cpu = cpu_pool.submit(sweep_jobs.environment)
        envs = sweep.fetch_outputs([gpu_pool.submit(sweep_jobs.environment) for _ in range(4)])
    assert sorted(e["CUDA_VISIBLE_DEVICES"] for e in envs) == ["0", "0", "1", "1"]
    assert {e["XLA_PYTHON_CLIENT_MEM_FRACTION"] for e in envs} == {"0.45"}
    assert {e["XLA_PYTHON_CLIENT_PREALLOCATE"] for e in envs} == {"false"}
    assert {e["NCCL_NVLS_ENABLE"] for e in envs} == {"0"}
    assert cpu.result() == {"CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu",
                            "XLA_PYTHON_CLIENT_MEM_FRACTION": None,
                            "XLA_PYTHON_CLIENT_PREALLOCATE": None, "NCCL_NVLS_ENABLE": "0"}


def test_report_outside_a_pool_does_nothing():
    assert sweep.report({"loss": np.float32(1.5)}) is None
    assert sweep_jobs.add(1, 2) == 3


def test_make_slots():
    assert [s.gpu for s in devices.make_slots("all", 2, ["0", "1"])] == ["0", "0", "1", "1"]
    assert [s.gpu for s in devices.make_slots(3, 1, [])] == [None] * 3
    assert len(devices.make_slots("all", 1, [])) == devices.default_cpu_slots()
    assert [s.gpu for s in devices.make_slots([1], 1, ["0", "1"])] == ["1"]
    assert [s.gpu for s in devices.make_slots(1, 1, ["0", "1"])] == ["0"]
    for bad, kwargs in [(5, {}), (["7"], {}), ("some", {}), (1, {"jobs_per_device": 0})]:
        with pytest.raises(ValueError):
            devices.make_slots(bad, kwargs.get("jobs_per_device", 1), ["0", "1"])


@pytest.mark.slow
def test_train_job_end_to_end(tmp_path):
    """The sweep's user path: train_job in a worker, progress to after_each, (net, info) back."""
    options = {"max_epochs": 2, "mini_batch_size": 128, "validation_frequency": 100,
               "verbose": False, "solver": "adam", "initial_learn_rate": 0.01}
    with sweep.DevicePool(1, log_dir=tmp_path) as pool:
        records, lock = _collect(pool)
        futures = [pool.submit(sweep.train_job, data={"train": "digits", "validation": 0.2},
                               model=("cifar_net", {"depth": 1}), options=options, seed=0,
                               execution=jf.ExecutionOptions(steps_per_dispatch=1))]
        nets, infos = sweep.fetch_outputs(futures)
    (net,), (info,) = nets, infos
    assert isinstance(net, jf.TrainedNet) and isinstance(info, jf.TrainingInfo)
    messages = [m for _, m, _ in records]
    assert messages[0]["state"] == "start" and messages[-1]["state"] == "done"
    iterations = [m for m in messages if m["state"] == "iteration"]
    assert [m["iteration"] for m in iterations] == info.iteration.tolist()
    assert {"iteration", "epoch", "loss", "accuracy", "learn_rate"} <= iterations[0].keys()
    np.testing.assert_allclose([m["loss"] for m in iterations], info.loss, rtol=1e-6)
    assert [m["validation_accuracy"] for m in messages if "validation_accuracy" in m] == \
        pytest.approx(info.validation_accuracy.tolist())
    # The weights came back intact: predicting the held-out digits here gives the accuracy
    # the worker measured (up to one image of 360, for float-order differences).
    _, held_out = jf.data.digits().split_each_label(0.8, seed=0)
    predicted = np.argmax(jf.predict(net, held_out), axis=1)
    accuracy = 100 * np.mean(predicted == held_out.labels)
    assert accuracy == pytest.approx(info.final_validation_accuracy, abs=0.3)
    assert info.final_validation_accuracy > 20, "chance is 10 %"
