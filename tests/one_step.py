"""One training step through ``train``, and the weights and gradient before it, for tests
that check a solver's update against numpy."""
import jax
import numpy as np

import jaxflowers as jf

N = 48  # one mini-batch of 48: exactly one step


def one_step(data, rate, execution=None, **options):
    """The float64 parameters after one step of ``train`` at ``rate`` (plain SGD unless
    ``options`` say otherwise), batch norm synchronised across devices."""
    execution = execution or jf.ExecutionOptions()
    opts = jf.TrainingOptions(**{"solver": "sgdm", "momentum": 0, "l2_regularization": 0,
                                 **options}, initial_learn_rate=rate, mini_batch_size=N,
                              max_epochs=1, verbose=False,
                              batch_normalization_statistics="moving")
    net, info = jf.train(data, jf.models.cifar_net(1), opts,
                         execution=execution.replace(sync_batch_norm=True))
    assert len(info.loss) == 1
    return jax.tree.map(lambda x: np.asarray(x, np.float64), net.variables["params"])


def step_start(digits, num_devices=None):
    """(data, initial weights p0, gradient g) of one step on ``num_devices`` (default all),
    from two plain SGD steps."""
    data = digits.subset(np.random.default_rng(2).permutation(len(digits))[:N])
    execution = jf.ExecutionOptions(num_devices=num_devices)
    one, two = one_step(data, 1.0, execution), one_step(data, 2.0, execution)
    return (data, jax.tree.map(lambda a, b: 2 * a - b, one, two),
            jax.tree.map(lambda a, b: a - b, one, two))


class StepStarts:
    """``step_start`` per device count, each computed once: the digits' flat backgrounds
    tie in max pooling, and another device count's rounding may route a tie's gradient to
    another pixel, so a step is compared with the gradient of its own device count."""

    def __init__(self, digits):
        self.digits, self._starts = digits, {}

    def __call__(self, execution=None):
        n = (execution or jf.ExecutionOptions()).num_devices
        if n not in self._starts:
            self._starts[n] = step_start(self.digits, n)
        return self._starts[n]
