"""Streamed training from a memory-mapped set larger than the memory the process may use.

    sudo python benchmarks/stream_beyond_memory.py DIR [--images 100000] [--memory-gb 8] \
        [--resident-images 10000] [--epochs 1] [--size 224] [--model resnet50] \
        [--read-batches 200] [--folder ROOT] [--runs resident stream-memmap] \
        [--checkpoints] [--compile-cache CACHE] [--repeat N] [--out FILE]

Writes ``DIR/images.npy`` (random pixels, ``--size`` square; the Flowers recipe, 102 classes,
ResNet-50 or ``--model cifar_net:DEPTH`` for a quick run on a CPU), or with ``--folder``
builds the class folder ROOT's resize cache in DIR and uses its file (the folder's classes),
then, in a child process placed in a cgroup-v2 group whose ``memory.max`` is
``--memory-gb``, times the stream's reader alone on random batches (with the rows' pages
advised ahead, as training reads them, and by plain indexing of the memory map), then trains
each of ``--runs``: ``resident`` on ``--resident-images`` random rows (the rate to compare
with), ``stream-memmap`` streamed from the memory map over the whole set (an ``ImageSet``:
its statistics, and with ``--checkpoints`` its data digest, are a pass over it), and with
``--folder`` ``stream-folder``, the ``ImageFolder`` opened from its cache (both from what the
cache stores). ``--checkpoints`` gives every run a checkpoint folder. ``--compile-cache`` turns
on JAX's compilation cache in that folder and ``--repeat 2`` trains each run twice, so the
second of each loads its programs instead of compiling them beside its first steps (a rate
nearer the steady one). A set bigger than the
group's memory cannot stay in the page cache, so each epoch reads it from disk. Prints each
run's ``info.images_per_second``, the share of the resident rate, its set-up, the bytes the
child read from disk (``/proc/self/io``) and the group's peak memory. Needs root and a
writable ``/sys/fs/cgroup`` (v2 or v1's memory controller; else it says so and stops).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, os, sys, tempfile, time
import numpy as np
import jaxflowers as jf
path, model_name = sys.argv[1], sys.argv[4]
resident_count, epochs, read_batches = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
folder_root, size, run_names = sys.argv[6], int(sys.argv[7]), sys.argv[8].split(",")
checkpoints = sys.argv[9] == "1"
compile_cache, repeat = sys.argv[10], int(sys.argv[11])
if compile_cache:
    jf.enable_compilation_cache(compile_cache)
images = np.load(path, mmap_mode="r")
if folder_root:  # the folder's cache is ``path``: its rows, labels and classes
    start = time.perf_counter()
    folder = jf.data.ImageFolder(folder_root, image_size=size, cache_dir=os.path.dirname(path))
    assert folder.cache_path == path and len(folder) == len(images)
    print(json.dumps({"placement": "open-folder", "wall_s": time.perf_counter() - start}),
          flush=True)
    labels, names = np.asarray(folder.labels), folder.class_names
else:
    labels = np.random.default_rng(0).integers(0, 102, len(images))
    names = tuple(str(i) for i in range(102))
model = (jf.models.resnet50(num_classes=len(names)) if model_name == "resnet50" else
         jf.models.cifar_net(depth=int(model_name.split(":")[1]), num_classes=len(names)))

def read_bytes():
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("read_bytes")).split()[1])

def drop_pages():  # the set out of the page cache again, so the next reader starts cold
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)

# The stream's reader alone (grain's threads), on random batches of the whole set: with the
# rows' pages advised ahead (what training uses), and by plain indexing of the memory map.
from jaxflowers.data.feed import epoch_order
from jaxflowers.data.stream import host_batches

class PlainIndexing:
    def __init__(self, images):
        self.images, self.labels = images, labels
    def __len__(self):
        return len(self.images)
    def read(self, index):
        return self.images[index]

order = epoch_order(len(images), 128, 1, "every-epoch", 1)[:read_batches]
readers = (("read-advised", jf.data.ImageSet), ("read-plain", PlainIndexing))
for name, kind in readers if read_batches else ():  # --read-batches 0: skipped
    drop_pages()
    mapped = np.load(path, mmap_mode="r")  # its own map: unmapped after, so its pages can go
    source = kind(mapped, labels, names) if kind is jf.data.ImageSet else kind(mapped)
    before, start = read_bytes(), time.perf_counter()
    for _ in host_batches(source, order):
        pass
    seconds = time.perf_counter() - start
    del source, mapped
    print(json.dumps({"placement": name, "images": order.size, "wall_s": seconds,
                      "images_per_s": order.size / seconds,
                      "disk_read_gb": (read_bytes() - before) / 1e9}), flush=True)
drop_pages()

picked = np.sort(np.random.default_rng(1).choice(len(images), resident_count, replace=False))
sets = {"resident": lambda: jf.data.ImageSet(np.array(images[picked]), labels[picked], names),
        "stream-memmap": lambda: jf.data.ImageSet(images, labels, names),
        "stream-folder": lambda: folder}
for placement in [name for name in run_names for _ in range(repeat)]:
    # the resident run: a few epochs of its subset, to time it
    data = sets[placement]()
    epochs_here = max(epochs, 4) if placement == "resident" else epochs
    options = jf.recipes.flowers_options(1, len(data), max_epochs=epochs_here).replace(
        verbose=False, validation_frequency=10**9)
    if checkpoints:  # its data digest is taken in the set-up; one checkpoint, at the end
        options = options.replace(checkpoint_path=tempfile.mkdtemp(prefix="sbm-ck-"),
                                  checkpoint_frequency=epochs_here)
    drop_pages()
    before, start = read_bytes(), time.perf_counter()
    net, info = jf.train(data, model, options, execution=jf.ExecutionOptions(
        data_placement=placement.split("-")[0]))
    print(json.dumps({"placement": placement, "images": len(data), "epochs": epochs_here,
                      "images_trained": len(info.iteration) * options.mini_batch_size,
                      "wall_s": time.perf_counter() - start, "setup_s": info.setup_time,
                      "compile_s": info.compile_time, "train_s": info.train_time,
                      "images_per_s": info.images_per_second,
                      "disk_read_gb": (read_bytes() - before) / 1e9}), flush=True)
    data = net = info = None  # a resident copy goes before the next run makes its own
"""


def write_set(folder: str, count: int, size: int = 224, block: int = 2048) -> str:
    """``folder/images.npy``: random images, ``block`` at a time, then dropped from the page
    cache."""
    import numpy as np

    path = os.path.join(folder, "images.npy")
    out = np.lib.format.open_memmap(path, "w+", np.uint8, (count, size, size, 3))
    # One random block, then each block XOR-ed with its own byte: drawing 15 GB of random
    # bytes would take longer than the training it feeds.
    base = np.random.default_rng(0).integers(0, 256, (block, size, size, 3), dtype=np.uint8)
    for number, start in enumerate(range(0, count, block)):
        stop = min(count, start + block)
        np.bitwise_xor(base[:stop - start], np.uint8(number % 256), out=out[start:stop])
    out.flush()
    del out
    # Out of the page cache (it was charged to this process's group, not the child's), so the
    # child reads the set from disk.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return path


def cache_of(root: str, folder: str, size: int) -> str:
    """The resize cache of the class folder ``root`` at ``size``, built in ``folder`` if
    needed, then dropped from the page cache; its ``.npy`` file."""
    import jaxflowers as jf

    path = jf.data.ImageFolder(root, image_size=size, cache_dir=folder).cache_path
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return path


class MemoryGroup:
    """A cgroup memory limit for a child process: cgroup v2's ``memory.max``, or v1's
    ``memory.limit_in_bytes``. OSError if neither can be made (not root, read-only)."""

    def __init__(self, name: str, memory_bytes: int):
        v2, v1 = "/sys/fs/cgroup", "/sys/fs/cgroup/memory"
        if os.path.exists(os.path.join(v2, "cgroup.subtree_control")):
            with open(os.path.join(v2, "cgroup.subtree_control")) as f:
                if "memory" not in f.read().split():
                    self._write(os.path.join(v2, "cgroup.subtree_control"), "+memory")
            self.folder, self.files = os.path.join(v2, name), ("memory.max", "memory.peak",
                                                             "memory.events")
        elif os.path.isdir(v1):
            self.folder, self.files = os.path.join(v1, name), (
                "memory.limit_in_bytes", "memory.max_usage_in_bytes", "memory.failcnt")
        else:
            raise OSError("no cgroup memory controller under /sys/fs/cgroup")
        os.makedirs(self.folder, exist_ok=True)
        self._write(os.path.join(self.folder, self.files[0]), str(memory_bytes))
        for swap in ("memory.swap.max", "memory.memsw.limit_in_bytes"):
            if os.path.exists(os.path.join(self.folder, swap)):
                try:
                    self._write(os.path.join(self.folder, swap),
                                "0" if swap == "memory.swap.max" else str(memory_bytes))
                except OSError:
                    pass

    @staticmethod
    def _write(path: str, text: str) -> None:
        with open(path, "w") as f:
            f.write(text)

    def read(self) -> dict:
        """The group's peak memory (GiB) and its limit events (v2) or failure count (v1)."""
        out = {}
        for name in self.files[1:]:
            path = os.path.join(self.folder, name)
            if os.path.exists(path):
                with open(path) as f:
                    text = f.read().strip()
                out[name] = (round(int(text) / 2**30, 2) if name != "memory.events"
                             and text.isdigit() and name != "memory.failcnt" else text)
        return out

    def remove(self) -> None:
        os.rmdir(self.folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dir", help="folder for images.npy (on the disk to stream from)")
    parser.add_argument("--images", type=int, default=100_000, help="15 GB at 224x224")
    parser.add_argument("--memory-gb", type=float, default=8.0, help="the child's memory.max")
    parser.add_argument("--resident-images", type=int, default=10_000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--size", type=int, default=224, help="pixels per side")
    parser.add_argument("--model", default="resnet50", help="resnet50 or cifar_net:DEPTH")
    parser.add_argument("--read-batches", type=int, default=200,
                        help="random batches of 128 read by the stream's reader alone, with "
                             "and without the read-ahead (0: skip)")
    parser.add_argument("--folder", help="a class folder whose resize cache (built in DIR) is "
                                         "the set, instead of random pixels")
    parser.add_argument("--runs", nargs="+", default=None,
                        choices=("resident", "stream-memmap", "stream-folder"),
                        help="trainings, in order (default: resident, stream-memmap, and "
                             "stream-folder with --folder)")
    parser.add_argument("--checkpoints", action="store_true",
                        help="give every training a checkpoint folder (its data digest)")
    parser.add_argument("--compile-cache", help="JAX's compilation cache folder for the child")
    parser.add_argument("--repeat", type=int, default=1, help="trainings of each run, in a row")
    parser.add_argument("--out", help="JSON file for the rows")
    args = parser.parse_args()
    runs = args.runs or ["resident", "stream-memmap"] + (["stream-folder"] if args.folder else [])
    if "stream-folder" in runs and not args.folder:
        parser.error("--runs stream-folder needs --folder")
    try:
        group = MemoryGroup(f"jaxflowers-stream-{os.getpid()}", int(args.memory_gb * 2**30))
    except OSError as error:
        sys.exit(f"cannot make a cgroup memory group under /sys/fs/cgroup: {error}")
    os.makedirs(args.dir, exist_ok=True)
    start = time.perf_counter()
    path = (cache_of(args.folder, args.dir, args.size) if args.folder else
            write_set(args.dir, args.images, args.size))
    size_gb = os.path.getsize(path) / 1e9
    print(f"wrote {path}: {size_gb:.1f} GB in {time.perf_counter() - start:.1f} s; the child "
          f"may use {args.memory_gb:g} GiB", flush=True)
    # Join the group first, then exec the child: all it maps and caches counts against it.
    command = ["sh", "-c", f'echo $$ > {group.folder}/cgroup.procs && exec "$0" "$@"',
               sys.executable, "-c", CHILD, path, str(args.resident_images), str(args.epochs),
               args.model, str(args.read_batches), args.folder or "", str(args.size),
               ",".join(runs), "1" if args.checkpoints else "0",
               os.path.abspath(args.compile_cache) if args.compile_cache else "",
               str(args.repeat)]
    # Each row printed as it comes, so that a run cut short still shows what it measured.
    rows, errors = [], tempfile.TemporaryFile("w+")
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True) as child:
        for line in child.stdout:
            if line.startswith("{"):
                rows.append(json.loads(line))
                print(line.rstrip(), flush=True)
    returncode = child.returncode
    errors.seek(0)
    stderr = errors.read()
    memory = group.read()
    group.remove()
    if returncode:
        print(f"the child failed (rc {returncode}; the group: {memory}):\n{stderr[-2000:]}",
              flush=True)
    if args.out:  # before the summary, so that the rows are kept whatever it prints
        with open(args.out, "w") as f:
            json.dump({"images": args.images, "folder": args.folder, "runs": runs,
                       "checkpoints": args.checkpoints, "compile_cache": args.compile_cache,
                       "repeat": args.repeat, "set_gb": size_gb,
                       "memory_gb": args.memory_gb, "group": memory, "rows": rows,
                       "returncode": returncode}, f, indent=1)
    # the last resident run (with --repeat, the one whose programs were loaded)
    resident = next((r["images_per_s"] for r in reversed(rows) if r["placement"] == "resident"),
                    None)
    for row in rows:
        if "images_per_s" not in row:
            print(f"{row['placement']:14s} {row['wall_s']:.2f} s", flush=True)
            continue
        share = f", {100 * row['images_per_s'] / resident:.1f} % of resident" if resident else ""
        setup = f"; set-up {row['setup_s']:.1f} s" if "setup_s" in row else ""
        trained = f", {row['images_trained']} trained" if "images_trained" in row else ""
        print(f"{row['placement']:14s} {row['images']:7d} images{trained}: "
              f"{row['images_per_s']:7.0f} images/s{share}{setup}, read from disk "
              f"{row['disk_read_gb']:.1f} GB", flush=True)
    print(f"the group (limit {args.memory_gb:g} GiB): {memory}", flush=True)


if __name__ == "__main__":
    main()
