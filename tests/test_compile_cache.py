"""The persistent compilation cache: a second process loads what the first compiled."""
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import pytest

import jaxflowers as jf

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROGRAM = """
import jaxflowers as jf
print(jf.enable_compilation_cache(min_compile_time_s=0))
import jax, jax.numpy as jnp
print(float(jax.jit(lambda x: jnp.sin(x) @ jnp.cos(x).T)(jnp.ones((64, 64))).sum()))
"""


def _run(env):
    result = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split()


def test_second_process_reuses_the_cached_programs(tmp_path):
    cache = tmp_path / "xla"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               JAXFLOWERS_COMPILE_CACHE=str(cache))
    folder, value = _run(env)
    assert pathlib.Path(folder) == cache
    entries = sorted(p.name for p in cache.iterdir())
    assert entries  # the jitted program (and JAX's helpers) were stored
    assert _run(env) == [folder, value]
    assert sorted(p.name for p in cache.iterdir()) == entries  # loaded, nothing new compiled


def test_off_in_the_environment_leaves_the_cache_off(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               JAXFLOWERS_COMPILE_CACHE="off", JAXFLOWERS_CACHE_DIR=str(tmp_path))
    folder, _ = _run(env)
    assert folder == "None" and not any(tmp_path.iterdir())


def test_default_folder_is_inside_the_jaxflowers_cache_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("JAXFLOWERS_COMPILE_CACHE", raising=False)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               JAXFLOWERS_CACHE_DIR=str(tmp_path))
    env.pop("JAXFLOWERS_COMPILE_CACHE", None)
    folder, _ = _run(env)
    assert pathlib.Path(folder) == tmp_path / "xla" and any((tmp_path / "xla").iterdir())


def _blocked(tmp_path) -> pathlib.Path:
    """A file: folders "inside" it cannot be created, even by root."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    return blocker


def test_an_unwritable_compilation_cache_folder_is_a_warning(tmp_path, monkeypatch):
    folder = _blocked(tmp_path) / "xla"
    before = jax.config.jax_compilation_cache_dir
    with pytest.warns(UserWarning, match=f"compilation cache folder {re.escape(str(folder))} "
                                         "cannot be written .*going on without the cache"):
        assert jf.enable_compilation_cache(folder) is None
    monkeypatch.setenv("JAXFLOWERS_COMPILE_CACHE", str(folder))
    with pytest.warns(UserWarning, match="set JAXFLOWERS_COMPILE_CACHE to another folder"):
        assert jf.enable_compilation_cache() is None
    assert jax.config.jax_compilation_cache_dir == before


TRAINING = """
import json, os, sys
import numpy as np
import jaxflowers as jf
cache = sys.argv[1]
jf.enable_compilation_cache(cache, min_compile_time_s=0)
for seed, data_seed, epochs, solver in json.loads(sys.argv[2]):
    rate, l2, threshold, drop, epsilon, period = (float(v) for v in solver)
    rng = np.random.default_rng(data_seed)
    n = 96
    data = jf.data.ImageSet(rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
                            rng.permutation(np.arange(n) % 3), ("a", "b", "c"))
    train, test = data.split_each_label(0.75, seed=seed)
    options = jf.TrainingOptions(
        solver="adam", mini_batch_size=16, max_epochs=epochs, validation_data=test,
        validation_frequency=2, output_network="best-validation", seed=seed, verbose=False,
        augmentation=jf.recipes.augmentation("flowers"), learn_rate_schedule="piecewise",
        learn_rate_drop_period=int(period), learn_rate_drop_factor=drop, epsilon=epsilon,
        initial_learn_rate=rate, l2_regularization=l2, gradient_threshold=threshold)
    net, info = jf.train(train, jf.models.cifar_net(1, num_classes=3), options,
                         execution=jf.ExecutionOptions(parameter_layout="flat"))
    jf.predict(net, test.images)
    print(json.dumps([info.learn_rate[0], info.learn_rate[-1], float(info.loss[-1]),
                      sorted(os.listdir(cache))]), flush=True)
"""


def test_a_new_seed_split_data_set_number_of_epochs_or_solver_value_compiles_nothing_new(
        tmp_path):
    """Seeds, the split, the pixels and the solver's hyperparameters (learning rate, L2,
    gradient threshold, epsilon, the piecewise drops' factor and period) are arguments of the
    compiled programs, never constants, and no shape follows the number of epochs (the
    iteration plan comes a window at a time, the learning rate's drops are computed): runs
    that differ only in these load every program from the cache, and train with their own
    values. The runs after the first share a second process: a program that one of them
    compiled anew would add an entry to the cache there too."""
    cache = tmp_path / "xla"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), JAX_NUM_CPU_DEVICES="2")
    base = ("0.001", "0.0001", "5", "0.1", "1e-8", "1")

    def process(runs):
        """Each run's (cache entries after it, last loss), the run's own rates checked."""
        result = subprocess.run([sys.executable, "-c", TRAINING, str(cache), json.dumps(runs)],
                                env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        assert len(lines) == len(runs)
        for (_, _, epochs, solver), (rate, last, *_) in zip(runs, lines):
            base_rate, drop, period = float(solver[0]), float(solver[3]), int(solver[5])
            assert rate == pytest.approx(base_rate, rel=1e-6)  # the run's own rate and drops
            assert last == pytest.approx(base_rate * drop ** ((epochs - 1) // period), rel=1e-6)
        return [(entries, loss) for _, _, loss, entries in lines]

    [(first, loss)] = process([(0, 0, 2, base)])
    assert len(first) >= 4  # init, training block, validation, population: all stored
    runs = process([
        (1, 0, 2, base),  # another seed (so another split and initial network)
        (2, 1, 2, base),  # other images and labels of the same shapes
        (2, 1, 5, base),  # a longer run, past more of the schedule's drops
        # a search's next trials, which train with their own values, not the first run's
        (0, 0, 2, ("0.02", "0.003", "0.5", "0.1", "1e-8", "1")),
        (0, 0, 2, ("0.001", "0.0001", "5", "0.1", "1e-3", "1")),  # epsilon alone
        (0, 0, 5, ("0.02", "0.003", "0.5", "0.5", "1e-4", "2"))])
    assert [entries for entries, _ in runs] == [first] * 6
    assert runs[3][1] != loss and runs[4][1] != loss
