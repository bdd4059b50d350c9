"""Benchmark scripts run against the package as it is (the cold start's pieces compile the
programs ``train`` builds, the listing times ``ImageFolder``'s scan, ...), on tiny inputs, so a
change of what they call cannot leave them broken unnoticed."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
from benchmark_script import load
from image_folders import class_folders

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("piece", ["init", "all"])
def test_cold_start_compiles_each_piece_of_the_sweeps_network(tmp_path, piece):
    data = class_folders(tmp_path / "data", per_class=20, classes=("a", "b", "c"), size=(12, 10))
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAXFLOWERS_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cold_start.py"), piece, str(data),
         "--model", "cifar_net:1", "--per-device-batch", "4"],
        env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    row = json.loads(result.stdout.strip().splitlines()[-1])
    assert row["piece"] == piece and row["model"] == "cifar_net:1"
    assert row["compile"]["wall_s"] > 0


def test_autotune_sets_merges_the_folders_and_asks_for_a_workload(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, text in ((first, "from a"), (second, "from b")):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "same.textproto").write_text(text)
        (folder / f"{folder.name}.textproto").write_text(text)
    copied = load("autotune_sets").merge([str(first), str(second), str(tmp_path / "no")],
                                            str(tmp_path / "merged"))
    merged = tmp_path / "merged"
    assert copied == 3 and (merged / "sub" / "same.textproto").read_text() == "from a"
    assert sorted(p.name for p in merged.iterdir()) == ["a.textproto", "b.textproto", "sub"]
    summary = load("autotune_sets").summary
    sweep = {"wall_s": 30.61, "returncode": 0, "jobs": [
        "job 0 (depth 1): 71.08% (compile 4.1 s, training 7.2 s; first step at 9.0 s)",
        "job 3 (depth 4): 77.06% (compile 5.4 s, training 15.1 s; first step at 12.2 s)"]}
    assert summary(sweep) == "wall   30.6 s, compile   5.4 s, accuracy 71.08 77.06"
    example = {"wall_s": 30.9, "returncode": 0, "jobs": [], "compile_s": 11.3,
               "test_accuracy": 21.53}
    assert summary(example) == "wall   30.9 s, compile  11.3 s, accuracy 21.53"
    assert summary({"wall_s": 300.0, "returncode": "timeout", "stdout_tail": "Run folder: x\n"}
                   ) == "FAILED (timeout): Run folder: x"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "autotune_sets.py"),
                             "--sets", str(tmp_path / "sets")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "--sweep DATA, --example DATA or both" in result.stderr


def test_autotune_sets_keeps_other_sets_and_packs_nothing_when_its_run_fails(tmp_path):
    from jaxflowers.compilation import autotune

    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.textproto").write_text('device_str: "GPU"\n')
    software = {"jaxlib": "jaxlib==0.0.1", "plugin": "jax-cuda12-plugin==0.0.1",
                "cudnn": "nvidia-cudnn-cu12==0.0.1"}
    autotune.pack(tmp_path / "results", tmp_path / "sets" / "old.zip", device_kind="GPU",
                  software=software)
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "autotune_sets.py"),
                             "--sets", str(tmp_path / "sets"), "--sweep", str(tmp_path / "no")],
                            capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    # No set matches here, so it first runs the sweep to fill one; that run fails (no data).
    assert result.returncode == 1, result.stderr
    assert "the sweep run that was to fill the set failed: no set packed" in result.stderr
    assert "sweep    without set  FAILED" in result.stdout and "wall" not in result.stdout
    assert sorted(p.name for p in (tmp_path / "sets").iterdir()) == ["old.zip"]


def test_gpu_kernels_counts_one_iteration_of_the_loop_and_what_is_outside_it():
    # An optimized GPU module's shape: a loop whose body trains in one branch of a conditional.
    fixture = (ROOT / "tests" / "fixtures" / "gpu_block.hlo").read_text()
    counted = load("gpu_kernels").count(fixture)
    # condition 1 + body: the branch test 1, the training branch 3 (the larger one)
    assert counted["per_iteration"] == 5 and counted["per_dispatch"] == 1
    assert counted["by_kind"] == {"fusion (loop)": 3, "cudnn": 1,
                                  "fusion (reduce/transpose)": 1}
    assert counted["by_place"] == {"other": 3, "forward": 1, "backward": 1}
    pallas = """ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %pallas_call.1 = f32[8]{0} custom-call(%p), custom_call_target="__gpu$xla.gpu.triton"
}"""
    assert load("gpu_kernels").count(pallas)["by_kind"] == {"pallas": 1}


def test_gpu_kernels_reads_the_module_xla_compiles_here():
    import jax
    import jax.numpy as jnp

    def block(x):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ c) + 1, c.sum()), x, length=4)

    hlo = jax.jit(block).lower(jnp.ones((8, 8))).compile().as_text()
    counted = load("gpu_kernels").count(hlo)
    assert counted["per_iteration"] >= 2  # the product, and the sum or the update
    assert all(x["loop"] for x in counted["launches"])


@pytest.mark.slow
def test_conv_lowering_computes_the_same_network_with_1x1_convolutions_as_products(tmp_path):
    script = load("conv_lowering")
    dot = script.write_dot_tree(str(tmp_path))
    layers = pathlib.Path(dot, "jaxflowers", "models", "layers.py")
    assert layers.read_text().endswith(script.DOT_PATCH)

    def outputs(root, name):
        # two stages of bottleneck blocks: unstrided and strided 1x1 convolutions
        return script.outputs(root, str(tmp_path / f"{name}.npz"), "resnet:1,1", 32)

    conv = outputs(str(ROOT), "conv")
    found = script.compare(conv, outputs(dot, "dot"))
    assert found["values"] > 3 * 10**4  # the outputs and every gradient
    # compiled, each tree's program sums in its own order: 1e-7 of the largest value here,
    # against half of it for a product that reads the wrong pixels
    assert found["max_abs_difference"] <= 2e-3 * found["max_abs_value"], found
    # a strided product that reads the wrong pixels (same shapes) is told apart
    layers.write_text(layers.read_text().replace("inputs[:, ::strides[0], ::strides[1], :]",
                                                 "inputs[:, 1::strides[0], 1::strides[1], :]"))
    wrong = script.compare(conv, outputs(dot, "wrong"))
    assert wrong["max_abs_difference"] > 0.1 * wrong["max_abs_value"], wrong


def test_listing_time_times_every_thread_count_against_the_floor(tmp_path):
    data = class_folders(tmp_path / "data", per_class=4, classes=("a", "b", "c"))
    (data / "a" / "notes.txt").write_text("not an image")
    out = tmp_path / "listing.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "listing_time.py"), str(data), "--workers",
         "1", "3", "--rounds", "2", "--every", "0", "--out", str(out)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{data}: 13 files" in result.stdout and "| scan, 3 threads |" in result.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["round"] for r in rows] == [0, 1]
    assert all(r["files"] == 12 and min(r["plain"], r["1"], r["3"]) > 0 for r in rows)


def test_end_to_end_caches_bytecode_in_the_scratch_folder_only_when_asked(tmp_path):
    """Where the environment forbids writing bytecode (the GPU host does), ``--bytecode
    cached`` lets the timed processes write and read it in the scratch folder, as an
    installed package runs; as-is keeps the environment's choice."""
    environment = load("end_to_end").run_environment
    base = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": "/pkg", "HOME": "/h"}
    cached = environment(str(tmp_path), "cached", base)
    assert "PYTHONDONTWRITEBYTECODE" not in cached
    assert cached["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pycache")
    assert cached["PYTHONPATH"].split(os.pathsep) == ["/pkg", os.getcwd()]
    assert cached["JAXFLOWERS_COMPILE_CACHE"] == str(tmp_path / "xla")
    as_is = environment(str(tmp_path), "as-is", base)
    assert as_is["PYTHONDONTWRITEBYTECODE"] == "1" and "PYTHONPYCACHEPREFIX" not in as_is
    assert base == {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": "/pkg", "HOME": "/h"}


def test_pool_backward_ways_equal_the_xla_phases_bit_for_bit(tmp_path):
    script = load("pool_backward")
    assert set(script.WAYS) == {"phases", "kernel", "masked"}
    result = script.main(["--check-only", "--batch", "1", "--check-size", "16", "--out",
                          str(tmp_path / "p.json")])
    assert result["check"] == {"phases": True, "kernel": True, "masked": True}
    # and the check tells a wrong backward apart: the masked way given the gradient mirrored
    def mirrored(window, strides, padding, residuals, dy):
        return script._masked_backward(window, strides, padding, residuals, dy[:, :, ::-1])
    script.WAYS["masked"] = script._way(script.maxpool._pool, mirrored)
    assert script.check(1, 16)["masked"] is False


def test_fused_gemm_kernels_equal_xlas_chain_forward_and_backward():
    script = load("fused_gemm")
    shape, config = (256, 64, 32), (64, 32, 32, 4, 2)  # several tiles and steps each way
    found = script.check(shape, config, interpret=True)
    # the output, the sums; the input gradient, the kernel gradient, the sums
    assert max(found["forward"]) < 1e-2 and max(found["backward"]) < 1e-4, found
    # the product without its prologue (batch norm's apply and ReLU) is told apart
    import gemm_kernels

    xs, _, w, p = script.inputs(shape, 1)
    plain = gemm_kernels.pallas_forward(xs[0], w, p, config=config, fused=False,
                                        interpret=True)
    chain, _ = gemm_kernels.forward_chain(xs[0], w, p)
    assert script._relative(plain, chain) > 0.1
    # and every way of a shape lowers to Triton without a GPU
    lowered, errors = script.lower_all([(1024, 128, 64)])
    assert lowered >= 10 and not errors, errors


def test_fused_gemm_weights_each_shape_by_its_stages_blocks(tmp_path, capsys):
    script = load("fused_gemm")
    times = {"forward": 10.0, "backward": 10.0, "forward-products": 1.0,
             "backward-products": 1.0, "pallas-forward": 4.0, "pallas-backward": 20.0}
    rows = [{"shape": list(shape), "way": way, "config": None, "us": us}
            for shape in script.SHAPES for way, us in times.items()]
    rows.append({"shape": list(script.SHAPES[0]), "way": "pallas-forward", "config": [1],
                 "error": "Triton could not compile it"})  # a failed configuration is skipped
    # 16 blocks, two 1x1 shapes each, forward and backward
    assert script.step_estimate(rows) == pytest.approx(
        {"chain": 16 * 4 * 10e-3, "products": 16 * 4 * 1e-3, "fused": 16 * 2 * 24e-3,
         "best": 16 * 2 * 14e-3})
    saved = tmp_path / "fused.json"
    saved.write_text(json.dumps({"checks": [], "rows": rows}))
    assert script.main(["--table", str(saved)]) == 0
    assert "saved -0.13 all fused, 0.19 the faster of each" in capsys.readouterr().out
    with pytest.raises(ValueError, match="backward: a way has no time"):
        script.step_estimate([r for r in rows if r["way"] != "pallas-backward"])


def test_fusion_bandwidth_counts_each_kernels_operands_and_results(tmp_path):
    import gzip
    script = load("fusion_bandwidth")
    hlo = """HloModule m

%fused_add (p0: f32[1000], p1: f32[1000]) -> f32[1000] {
  %p0 = f32[1000]{0} parameter(0)
  ROOT %add = f32[1000]{0} add(%p0, %p0)
}

ENTRY %main (a: f32[1000], b: bf16[10,50]) -> f32[1000] {
  %a = f32[1000]{0} parameter(0)
  %b = bf16[10,50]{1,0} parameter(1)
  %conv = (bf16[10,50]{1,0}, u8[0]{0}) custom-call(%b), custom_call_target="x"
  %loop_add_fusion.2 = f32[1000]{0} fusion(%a, %conv#0), kind=kLoop, calls=%fused_add, \
metadata={op_name="jit(f)/add"}
  ROOT %r = f32[1000]{0} copy(%loop_add_fusion.2)
}
"""
    assert script.instruction_bytes(hlo)["loop_add_fusion.2"] == {
        "read": 4000 + 1000, "written": 4000, "op_name": "jit(f)/add"}
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
              {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}}]
    for step in range(2):  # two steps: the fusion once (9 us), a library kernel twice
        events += [{"ph": "X", "pid": 1, "tid": 1, "name": "loop_add_fusion_2", "ts": step,
                    "dur": 9.0},
                   {"ph": "X", "pid": 1, "tid": 1, "name": "sm90_gemm", "ts": step, "dur": 3.0},
                   {"ph": "X", "pid": 1, "tid": 1, "name": "sm90_gemm", "ts": step, "dur": 3.0},
                   {"ph": "X", "pid": 2, "tid": 1, "name": "python", "ts": step, "dur": 99.0}]
    trace = tmp_path / "t.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": events}, f)
    rows = {r["kernel"]: r for r in script.table(hlo, str(trace), steps=2)}
    assert set(rows) == {"loop_add_fusion_2", "sm90_gemm"}
    fusion = rows["loop_add_fusion_2"]
    assert (fusion["ms"], fusion["calls"], fusion["bytes"]) == (0.009, 1.0, 9000)
    assert abs(fusion["tb_per_s"] - 9000 / 1e9 / 0.009) < 1e-12  # 9 kB in 9 us
    assert (rows["sm90_gemm"]["ms"], rows["sm90_gemm"]["calls"], rows["sm90_gemm"]["bytes"]) \
        == (0.006, 2.0, 0)


def test_checkpoint_writes_times_a_write_per_iteration(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "checkpoint_writes.py"), "--model",
         "cifar_net:1", "--iterations", "3", "--batch", "4", "--rounds", "1", "--out",
         str(tmp_path / "rows.json")],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
        timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = json.loads((tmp_path / "rows.json").read_text())
    assert row["tree"] == "installed" and row["writes"] == 3 and row["write_s"] > 0
    assert row["train_s_per_iteration_with"] > 0 and row["train_s_per_iteration_without"] > 0
