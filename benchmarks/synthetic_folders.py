"""Write the synthetic image folders the end-to-end benchmarks train on (no download).

    python benchmarks/synthetic_folders.py flowers DEST [--per-class N]   # 3,670 JPEGs, 320x240
    python benchmarks/synthetic_folders.py cifar DEST                     # 51,000 PNGs, 32x32

"flowers" has Flowers' five class folders and class sizes (daisy 633 ... tulips 799) of
smooth 320x240 JPEGs with noise (real-sized files to decode); "cifar" has CIFAR-10's
layout: train/classK (5,000 each) and test/classK (100 each) of random 32x32 PNGs.
Labels are random, so accuracies mean nothing: these folders measure time only.
"""
import argparse
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image

FLOWERS = {"daisy": 633, "dandelion": 898, "roses": 641, "sunflowers": 699, "tulips": 799}


def _flowers(args) -> None:
    root, cls, start, stop = args
    rng = np.random.default_rng([start, len(cls)])
    folder = os.path.join(root, cls)
    os.makedirs(folder, exist_ok=True)
    for i in range(start, stop):
        base = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8))
        smooth = np.asarray(base.resize((320, 240), Image.BILINEAR), np.int16)
        noisy = np.clip(smooth + rng.integers(-20, 20, smooth.shape), 0, 255).astype(np.uint8)
        Image.fromarray(noisy).save(os.path.join(folder, f"{i:05d}.jpg"), quality=90)


def _cifar(args) -> None:
    root, split, cls, start, stop = args
    rng = np.random.default_rng([start, cls, split == "test"])
    folder = os.path.join(root, split, f"class{cls}")
    os.makedirs(folder, exist_ok=True)
    for i in range(start, stop):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
            os.path.join(folder, f"{i:05d}.png"), compress_level=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("flowers", "cifar"))
    parser.add_argument("dest")
    parser.add_argument("--per-class", type=int, help="images per class (default: the real "
                        "set's counts)")
    args = parser.parse_args()
    if args.kind == "flowers":
        counts = {c: args.per_class or n for c, n in FLOWERS.items()}
        jobs = [(args.dest, c, s, min(s + 100, n)) for c, n in counts.items()
                for s in range(0, n, 100)]
        work = _flowers
    else:
        train, test = args.per_class or 5000, (args.per_class or 5000) // 50 or 1
        jobs = [(args.dest, split, c, s, min(s + 1000, n)) for split, n in (("train", train),
                                                                           ("test", test))
                for c in range(10) for s in range(0, n, 1000)]
        work = _cifar
    with ProcessPoolExecutor() as pool:
        list(pool.map(work, jobs))
    total = sum(len(files) for _, _, files in os.walk(args.dest))
    print(f"wrote {total} images under {args.dest}")


if __name__ == "__main__":
    main()
