"""Full-size torchvision and timm ResNet-50s through ``jf.models.resnet50(weights=...)``.

    python benchmarks/pretrained_check.py OUT_DIR

Builds each network with random weights (seeded; batch-norm statistics randomised too, so
a swapped mapping shows), writes its state dict as ``.safetensors`` (and torchvision's as
``.pth`` as well) into OUT_DIR, loads every file with jaxflowers and compares the logits of
four uint8 224x224 images, normalised as torchvision's ImageNet transform does, with
torch's float64 logits. Prints and writes ``OUT_DIR/pretrained_check.json``: the largest
absolute logit difference per file, the logits' scale, the devices and versions. JAX runs
at "highest" matmul precision (no TF32 on GPUs). Needs torch, torchvision and timm.
"""
import json
import pathlib
import sys

import jax
import numpy as np
import timm
import torch
import torchvision
from safetensors.torch import save_file

import jaxflowers as jf

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def randomise_norms(model, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            c = module.num_features
            module.weight.data = 0.5 + torch.rand(c, generator=generator)
            module.bias.data = 0.1 * torch.randn(c, generator=generator)
            module.running_mean.data = 0.1 * torch.randn(c, generator=generator)
            module.running_var.data = 0.5 + torch.rand(c, generator=generator)


def torch_logits(model, images: np.ndarray) -> np.ndarray:
    x = torch.from_numpy(images).double().permute(0, 3, 1, 2) / 255
    mean = torch.tensor(MEAN, dtype=torch.float64)[:, None, None]
    std = torch.tensor(STD, dtype=torch.float64)[:, None, None]
    with torch.no_grad():
        return model.double()((x - mean) / std).numpy()


def jax_logits(path: pathlib.Path, images: np.ndarray) -> np.ndarray:
    net = jf.models.resnet50(1000, weights=path)
    mean, std = net.normalization
    x = (images.astype(np.float32) - mean) / std
    with jax.default_matmul_precision("highest"):
        return np.asarray(jax.jit(lambda v, x: net.model.apply(v, x, train=False))(
            net.variables, x))


def main(out: pathlib.Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    images = np.random.default_rng(0).integers(0, 256, (4, 224, 224, 3), dtype=np.uint8)
    torch.manual_seed(0)
    networks = {"torchvision": torchvision.models.resnet50(weights=None),
                "timm": timm.create_model("resnet50", pretrained=False)}
    files = {}
    for seed, (name, model) in enumerate(networks.items()):
        randomise_norms(model, seed)
        model.eval()
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        files[f"{name}.safetensors"] = (name, out / f"{name}_resnet50.safetensors")
        save_file(state, files[f"{name}.safetensors"][1])
        if name == "torchvision":
            files["torchvision.pth"] = (name, out / "torchvision_resnet50.pth")
            torch.save(state, files["torchvision.pth"][1])
    reference = {name: torch_logits(model, images) for name, model in networks.items()}
    report = {"images": list(images.shape), "jax": jax.__version__, "torch": torch.__version__,
              "torchvision": torchvision.__version__, "timm": timm.__version__,
              "device": jax.devices()[0].device_kind, "files": {}}
    for label, (name, path) in files.items():
        got = jax_logits(path, images)
        difference, scale = np.abs(got - reference[name]).max(), np.abs(reference[name]).max()
        report["files"][label] = {
            "max_abs_logit_difference": float(difference), "max_abs_logit": float(scale),
            "relative": float(difference / scale),
            "same_top1": bool((got.argmax(1) == reference[name].argmax(1)).all())}
    (out / "pretrained_check.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    print(json.dumps(main(pathlib.Path(sys.argv[1])), indent=1))
