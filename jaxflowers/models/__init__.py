"""Models: the ResNet family, its torchvision/timm weights and the sweep's CIFAR networks."""
from jaxflowers.models.cifar import CifarNet, cifar_net, cifar_width
from jaxflowers.models.resnet import (
                                      BasicBlock,
                                      BottleneckBlock,
                                      ResNet,
                                      pretrained,
                                      resnet,
                                      resnet18,
                                      resnet34,
                                      resnet50,
                                      resnet101,
)
from jaxflowers.models.weights import Pretrained, imagenet_normalization

__all__ = ["BasicBlock", "BottleneckBlock", "CifarNet", "Pretrained", "ResNet", "cifar_net",
           "cifar_width", "imagenet_normalization", "pretrained", "resnet", "resnet18",
           "resnet34", "resnet50", "resnet101"]
