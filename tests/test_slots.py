"""jaxflowers.sweep.slots: where a job of one or several devices runs, and the pool placing
jobs of different sizes side by side without sharing a device a multi-device job owns."""
from __future__ import annotations

import pytest
import sweep_jobs

from jaxflowers import sweep
from jaxflowers.sweep import slots
from jaxflowers.sweep.backends.local import LocalBackend

pytestmark = pytest.mark.timeout(120)


def _free(*pairs) -> list[slots.Slot]:
    """Slots of 2 per device on 3 devices, keeping (device, j) pairs free."""
    everything = slots.make_slots(3, 2, ["0", "1", "2"])
    return [s for s in everything if (s.device, s.index % 2) in pairs]


def test_one_device_jobs_take_the_first_free_slot_off_claimed_devices():
    free = _free((0, 1), (1, 0), (1, 1))
    assert slots.place(free, 1) == [free[0]]
    assert slots.place(free, 1, avoid={0}) == [free[1]]
    assert slots.place(free, 1, avoid={0, 1}) is None


def test_several_devices_need_devices_without_any_job():
    free = _free((0, 1), (1, 0), (1, 1), (2, 0), (2, 1))
    held = slots.place(free, 2)  # device 0 has a packed job: devices 1 and 2 are taken whole
    assert sorted((s.device, s.index) for s in held) == [(1, 2), (1, 3), (2, 4), (2, 5)]
    assert slots.place(free, 3) is None
    merged = slots.merge(held)
    assert (merged.gpu, merged.devices, merged.num_devices, merged.jobs_per_device) == \
        ("1,2", (1, 2), 2, 1)
    assert merged.where == "GPUs 1,2" and slots.merge(held[:1]).where == "GPU 1"


def test_a_waiting_job_claims_the_devices_closest_to_free():
    free = _free((0, 1), (1, 0), (1, 1))
    assert slots.claim(free, [0, 1, 2], 2) == {1, 0}  # device 1 is free, device 0 half
    assert slots.claim(free, [0, 1, 2], 2, avoid={1}) == {0, 2}
    assert slots.claim(free, [0, 1, 2], 2, avoid={1, 2}) == set()


def test_a_cpu_slot_of_several_devices_gets_that_many_cpu_devices():
    cpu = slots.merge(slots.make_slots(4, 1, [])[1:3])
    base = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4 --xla_cpu_x=1"}
    env = slots.slot_environment(cpu, base)
    assert env["XLA_FLAGS"] == "--xla_cpu_x=1 --xla_force_host_platform_device_count=2"
    assert (env["JAX_NUM_CPU_DEVICES"], env["JAX_PLATFORMS"], cpu.where) == \
        ("2", "cpu", "CPU devices 1,2")
    gpus = slots.slot_environment(slots.merge(slots.make_slots(2, 2, ["0", "1"])), {})
    assert gpus["CUDA_VISIBLE_DEVICES"] == "0,1" and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in gpus


def test_the_pool_runs_a_two_device_job_beside_one_device_jobs(tmp_path):
    """On 4 CPU devices: a 1-device job, a 2-device job beside it, another 1-device job on
    the last device; then a 4-device job waits for all four, and a 1-device job submitted
    after it waits too, because the 4-device job has claimed every device."""
    with sweep.DevicePool(4, log_dir=tmp_path) as pool:
        assert (pool.num_slots, pool.num_devices) == (4, 4)
        first = [pool.submit(sweep_jobs.placed, 1.5),
                 pool.submit(sweep_jobs.placed, 1.5, num_devices=2),
                 pool.submit(sweep_jobs.placed, 1.5)]
        whole = pool.submit(sweep_jobs.placed, 0.5, num_devices=4)
        after = pool.submit(sweep_jobs.placed, 0.1)
        with pytest.raises(ValueError, match="num_devices=5 must be an integer from 1"):
            pool.submit(sweep_jobs.placed, 0.1, num_devices=5)
        devices, starts, ends = sweep.fetch_outputs([*first, whole, after])
    assert [f.slot.where for f in (*first, whole)] == [
        "CPU device 0", "CPU devices 1,2", "CPU device 3", "CPU devices 0,1,2,3"]
    assert after.slot.num_devices == 1
    assert (devices[1][0], devices[3][0]) == ("2", "4")  # one-device jobs keep the caller's
    assert max(starts[:3]) < min(ends[:3]), "the first three jobs run side by side"
    assert starts[3] >= max(ends[:3]) and starts[4] >= ends[3]


def test_packed_gpu_slots_make_way_for_a_job_of_two_whole_gpus(monkeypatch, tmp_path):
    monkeypatch.setattr(LocalBackend, "gpus", lambda self: ["0", "1"])  # no GPU here
    with sweep.DevicePool("all", warm_workers=False, jobs_per_device=2, log_dir=tmp_path) as pool:
        packed = pool.submit(sweep_jobs.placed, 1.0)
        both = pool.submit(sweep_jobs.placed, 0.1, num_devices=2)
        beside = pool.submit(sweep_jobs.placed, 0.1)  # GPU 1 is claimed: it waits
        devices, starts, ends = sweep.fetch_outputs([packed, both, beside])
    assert [gpus for _, gpus in devices] == ["0", "0,1", "0"]
    assert starts[1] >= ends[0] and starts[2] >= ends[1]
