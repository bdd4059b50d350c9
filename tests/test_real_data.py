"""Real photographs (../shared/data): CIFAR-10 sample through ImageFolder, trained and tested."""
import pytest

import jaxflowers as jf


@pytest.mark.slow
def test_cifar_net_learns_real_cifar10_sample(shared_data, tmp_path):
    root = shared_data / "cifar10-small"
    train = jf.data.ImageFolder(root / "train", image_size=(32, 32), cache_dir=tmp_path)
    test = jf.data.ImageFolder(root / "test", image_size=(32, 32), cache_dir=tmp_path)
    assert len(train) == 5000 and len(test) == 1000
    assert train.class_names == test.class_names and len(train.class_names) == 10
    opts = jf.TrainingOptions(solver="adam", initial_learn_rate=2e-3, mini_batch_size=128,
                              max_epochs=2, shuffle="every-epoch", verbose=False,
                              augmentation=jf.data.Augmentation(reflect_x=True))
    net, info = jf.train(train, jf.models.cifar_net(1), opts)
    assert info.loss[-10:].mean() < info.loss[:10].mean()
    labels = jf.scores_to_labels(jf.predict(net, test), net.class_names)
    accuracy = jf.accuracy(labels, test.labels)
    assert accuracy > 0.35, accuracy  # chance is 0.10
