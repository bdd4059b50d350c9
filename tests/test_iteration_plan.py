"""The iteration plan a resident training hands its dispatches: a window of the plan per
epoch, so the compiled program's shapes do not grow with the number of epochs."""
import jax
import numpy as np
import pytest

import jaxflowers as jf
from jaxflowers.data.feed import ResidentData
from jaxflowers.parallel import DataParallel
from jaxflowers.training import feeding


def _set(n=22):
    rng = np.random.default_rng(0)
    return jf.data.ImageSet(rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8),
                            rng.permutation(np.arange(n) % 2), ("a", "b"))


@pytest.mark.parametrize("length", [1, 3, 5, 7, 12])
def test_every_dispatch_finds_its_iterations_batches_in_the_window_it_is_given(length):
    """Blocks shorter than an epoch, as long, straddling two epochs, longer than one, and
    clipped at a sync point: each dispatch reads its own iterations' rows of the plan, and a
    new window is placed only when a dispatch starts in another epoch."""
    feed = ResidentData(_set(), mini_batch_size=4, num_epochs=4, shuffle="every-epoch", seed=1)
    assert feed.steps_per_epoch == 5 and feed.order.shape == (20, 4)
    seen, placements, starts = [], set(), []

    def compiled(state, images, labels, order, first_row, stats, hyper, limit):
        seen.append((np.asarray(order), int(first_row), int(limit)))
        placements.add(id(order))
        return state, {}

    parallel = DataParallel(jax.devices()[:1])
    run = feeding.runner(parallel, feed, compiled, ("images", "labels"), "stats", "hyper",
                         length)
    done, placed = 0, set()
    while done < 20:
        limit = min(done + 6, 20)  # a sync point every 6 iterations clips some blocks
        while done < limit:
            run(None, done, limit)
            starts.append(done)
            order, first_row, got_limit = seen[-1]
            steps = min(length, limit - done)
            assert got_limit == limit
            assert order.shape == (feed.window_rows(length), 4)
            for j in range(steps):
                np.testing.assert_array_equal(order[done + j - first_row], feed.order[done + j])
            placed.add(first_row)
            done += steps
    assert placed == {5 * (start // 5) for start in starts}
    assert len(placements) == len(placed)  # placed once per epoch a dispatch starts in
    longer = ResidentData(_set(), mini_batch_size=4, num_epochs=9, shuffle="every-epoch", seed=1)
    assert longer.window(8, longer.window_rows(length))[0].shape == order.shape


def test_the_window_past_the_plans_end_is_zeros():
    feed = ResidentData(_set(), mini_batch_size=4, num_epochs=2, shuffle="never", seed=0)
    window, first = feed.window(1, 7)
    assert first == 5
    np.testing.assert_array_equal(window[:5], feed.order[5:10])
    assert not window[5:].any()


def test_blocks_that_straddle_epochs_train_alike_whatever_their_length(digits):
    """Through ``train``: epochs of 6 iterations, shuffled every epoch, in dispatches of 4
    (windows switch inside a block) and of 7 (longer than an epoch) give the same losses and
    network (one loop body, compiled alike); a wrong window would train on other batches."""
    data = digits.subset(np.random.default_rng(0).permutation(len(digits))[:50])
    opts = jf.TrainingOptions(solver="sgdm", initial_learn_rate=0.05, mini_batch_size=8,
                              max_epochs=2, shuffle="every-epoch", verbose=False)
    runs = [jf.train(data, jf.models.cifar_net(1), opts,
                     execution=jf.ExecutionOptions(num_devices=1, steps_per_dispatch=steps))
            for steps in (4, 7)]
    (four, four_info), (seven, seven_info) = runs
    assert len(four_info.loss) == len(seven_info.loss) == 12
    np.testing.assert_allclose(seven_info.loss, four_info.loss, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 four.variables, seven.variables)
