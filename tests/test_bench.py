"""bench: the CLI writes a consistent bench.json and a valid speedup.png (not the speed).

The CLI runs in a subprocess with 2 fake CPU devices (this process has 4, fixed by
conftest before JAX started). --quick trains cifar_net:1 twice (1 and 2 devices): two
XLA:CPU compiles (at LLVM -O0, as in the other tests) plus milliseconds of training.
"""
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from jaxflowers.bench import report as bench_report
from jaxflowers.bench import scaling as bench

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2",
               XLA_FLAGS="--xla_force_host_platform_device_count=2 "
                         "--xla_backend_optimization_level=0", MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "jaxflowers.bench", "--quick", "--devices", "1",
                           "2", "--out", str(out)], cwd=out, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, done.stdout


@pytest.mark.slow
def test_quick_cli_writes_consistent_json(quick_run):
    out, stdout = quick_run
    report = json.loads((out / "bench.json").read_text())
    env = report["environment"]
    assert env["platform"] == "cpu" and env["local_device_count"] == 2
    assert env["fake_cpu_devices"] and env["devices"].startswith("2 CPU devices splitting")
    assert "one host's cores split into 2" in stdout and "speedups mean nothing" in stdout
    for key in ("device_kind", "jax", "jaxlib", "flax", "optax"):
        assert env[key]
    records = {r["devices"]: r for r in report["results"]}
    assert sorted(records) == [1, 2] and len(report["results"]) == 2
    for n, r in records.items():
        assert (r["model"], r["strategy"], r["scaling"]) == ("cifar_net:1", "shard_map", "weak")
        assert r["per_device_batch"] == 8 and r["global_batch"] == 8 * n  # weak: batch x N
        assert r["precision"] == "float32" and r["compile_s"] > 0
        assert len(r["windows_s"]) == report["settings"]["windows"]
        median = float(np.median(r["windows_s"]))
        assert r["images_per_s"] == pytest.approx(r["window_steps"] * r["global_batch"] / median)
        assert r["step_s"] == pytest.approx(median / r["window_steps"])
        # The warm-up window plus the timed ones ran, and train() stopped right after them.
        assert r["iterations"] == r["window_steps"] * (len(r["windows_s"]) + 1)
    speedup = records[2]["images_per_s"] / records[1]["images_per_s"]
    stored = {row["devices"]: row for row in report["speedup"]}
    assert stored[1]["speedup"] == pytest.approx(1.0)
    assert stored[2]["speedup"] == pytest.approx(speedup)
    assert stored[2]["efficiency"] == pytest.approx(speedup / 2)
    printed = [line.split() for line in stdout.splitlines()
               if re.match(r"cifar_net:1\s+shard_map\s+weak\s+2\s", line)]
    assert printed and float(printed[-1][7]) == pytest.approx(speedup, abs=0.006)


@pytest.mark.slow
def test_quick_cli_writes_png(quick_run):
    out, _ = quick_run
    png = (out / "speedup.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    image = matplotlib.image.imread(out / "speedup.png")
    assert image.ndim == 3 and min(image.shape[:2]) > 100


def test_devices_in_words():
    assert bench.describe_devices("gpu", "NVIDIA H200", 2) == "2 x NVIDIA H200"
    one = bench.describe_devices("cpu", "cpu", 1)
    assert one.startswith("1 CPU device (XLA:CPU on the host's") and "fake" not in one
    assert bench.describe_devices("cpu", "cpu", 4).startswith("4 CPU devices splitting one")


def test_device_counts():
    assert bench.device_counts(8) == [1, 2, 4, 8]
    assert bench.device_counts(6) == [1, 2, 4, 6]
    assert bench.device_counts(1) == [1]
    assert bench.device_counts(4, [2, 1, 2]) == [1, 2]
    with pytest.raises(ValueError, match="outside 1..2"):
        bench.device_counts(2, [1, 4])


def test_parse_model_and_options():
    spec = bench.parse_model("cifar_net:3")
    assert (spec.image_size, spec.num_classes, spec.build().depth) == (32, 10, 3)
    assert bench.parse_model("resnet50").augmentation.translate_x == (-30, 30)
    with pytest.raises(ValueError, match="cifar_net:<depth>"):
        bench.parse_model("cifar_net:x")
    settings = bench.BenchSettings(per_device_batch=16)
    weak = bench.config_options(spec, settings, strategy="pmap", scaling="weak", devices=4,
                                largest=4)
    strong = bench.config_options(spec, settings, strategy="pmap", scaling="strong",
                                  devices=2, largest=4)
    # Adam by default (1e-3 per 16 images), the learning rate scaled with the batch.
    assert (weak.solver, weak.mini_batch_size, weak.learn_rate) == (
        "adam", 64, pytest.approx(0.004))
    assert (strong.mini_batch_size, strong.learn_rate) == (64, pytest.approx(0.001))
    sgdm = bench.config_options(spec, bench.BenchSettings(per_device_batch=16, solver="sgdm"),
                                strategy="pmap", scaling="weak", devices=4, largest=4)
    assert (sgdm.solver, sgdm.learn_rate) == ("sgdm", pytest.approx(0.04))
    args = bench._parser().parse_args(["--solver", "sgdm"])
    assert bench.settings_from_args(args).solver == "sgdm"


def test_quick_flags_yield_to_explicit_ones():
    args = bench._parser().parse_args(["--quick", "--strategies", "pmap", "shard_map"])
    settings = bench.settings_from_args(args)
    assert settings.strategies == ("pmap", "shard_map")
    assert settings.models == ("cifar_net:1",) and settings.scalings == ("weak",)


def test_peer_ratios_match_like_with_like():
    ours = dict(framework="jaxflowers", model="resnet50", scaling="weak", devices=2,
                per_device_batch=64, image_size=224, strategy="shard_map", images_per_s=300.0)
    peer = dict(ours, framework="torch", strategy="torch-compile", images_per_s=200.0)
    other = dict(ours, devices=1, images_per_s=160.0)
    ours, peer = dict(ours, solver="sgdm"), dict(peer, solver="sgd", data="augment")
    other_solver = dict(peer, solver="adam", images_per_s=100.0)
    fixed_batch = dict(peer, data="fixed", images_per_s=250.0)  # no data work: not like ours
    ratios = bench_report.peer_ratios({"results": [ours, other, peer, other_solver, fixed_batch]})
    assert ratios == [dict(model="resnet50", devices=2, jaxflowers="shard_map",
                           torch="torch-compile", ratio=1.5)]


def test_fold_peer_adds_torch_lines_to_json_and_plot(tmp_path):
    def rec(framework, strategy, devices, ips):
        return dict(framework=framework, model="resnet50", strategy=strategy, scaling="weak",
                    devices=devices, per_device_batch=64, image_size=224, images_per_s=ips,
                    step_s=64 * devices / ips, compile_s=1.0, global_batch=64 * devices)

    report = {"results": [rec("jaxflowers", "shard_map", 1, 100.0),
                          rec("jaxflowers", "shard_map", 2, 190.0)], "speedup": []}
    peer = {"environment": {"torch": "x"}, "skipped": None,
            "results": [rec("torch", "torch-eager", 1, 80.0),
                        rec("torch", "torch-eager", 2, 150.0)]}
    bench_report.fold_peer(report, peer)
    assert report["peer"] == {"environment": {"torch": "x"}, "skipped": None}
    assert [r["ratio"] for r in report["peer_ratios"]] == [pytest.approx(1.25),
                                                           pytest.approx(190 / 150)]
    torch_rows = [r for r in report["speedup"] if r["strategy"] == "torch-eager"]
    assert [r["speedup"] for r in torch_rows] == [1.0, pytest.approx(150 / 80)]
    saved = bench_report.save(report, tmp_path / "bench.json")
    png = bench_report.draw(saved, tmp_path / "speedup.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert any("torch-eager" in line for line in bench_report.table_lines(report))
