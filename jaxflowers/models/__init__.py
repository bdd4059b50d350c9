"""Models: the ResNet family and the sweep's CIFAR networks (Flax linen modules)."""
from jaxflowers.models.cifar import CifarNet, cifar_net, cifar_width
from jaxflowers.models.resnet import (
                                      BasicBlock,
                                      BottleneckBlock,
                                      ResNet,
                                      resnet,
                                      resnet18,
                                      resnet34,
                                      resnet50,
                                      resnet101,
)

__all__ = ["BasicBlock", "BottleneckBlock", "CifarNet", "ResNet", "cifar_net", "cifar_width",
           "resnet", "resnet18", "resnet34", "resnet50", "resnet101"]
