"""XLA options of jaxflowers' programs: used by them, and never against the user's XLA_FLAGS."""
import jax
import numpy as np
import optax
import pytest

import jaxflowers as jf
from jaxflowers.compilation import options as xla_options
from jaxflowers.parallel import REPLICATED, DataParallel
from jaxflowers.training.step import init_program, init_variables


@pytest.fixture
def fresh(monkeypatch):
    """compiler_options() recomputed under this test's environment, and again afterwards."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.delenv(xla_options.OFF_ENV, raising=False)
    xla_options.compiler_options.cache_clear()
    yield monkeypatch
    xla_options.compiler_options.cache_clear()


def test_defaults_unless_the_user_names_them_or_turns_them_off(fresh):
    assert xla_options.compiler_options() == xla_options.DEFAULTS
    fresh.setenv("XLA_FLAGS", "--xla_gpu_enable_latency_hiding_scheduler=true")
    xla_options.compiler_options.cache_clear()
    assert xla_options.compiler_options() == {
        "xla_gpu_experimental_enable_fusion_autotuner": False}
    fresh.setenv(xla_options.OFF_ENV, "off")
    xla_options.compiler_options.cache_clear()
    assert xla_options.compiler_options() == {}


def test_an_option_this_xla_does_not_know_is_dropped_not_fatal(fresh):
    fresh.setitem(xla_options.DEFAULTS, "xla_gpu_no_such_option", False)
    assert xla_options.compiler_options() == {}


def test_the_step_and_init_programs_compile_with_them(monkeypatch):
    # A name XLA rejects, handed straight to the programs: their compiles must fail on it.
    bogus = {"xla_gpu_no_such_option": False}
    monkeypatch.setattr("jaxflowers.parallel.data_parallel.compiler_options", lambda: bogus)
    monkeypatch.setattr("jaxflowers.training.step.compiler_options", lambda: bogus)
    parallel = DataParallel(jax.devices()[:2], "shard_map")
    double = parallel.wrap(lambda x: 2 * x, (REPLICATED,), REPLICATED)
    with pytest.raises(Exception, match="xla_gpu_no_such_option"):
        double(np.ones(3, np.float32))
    program = init_program(init_variables(jf.models.cifar_net(1), (32, 32, 3)), optax.sgd(0.1))
    with pytest.raises(Exception, match="xla_gpu_no_such_option"):
        program(np.uint32(0))
