"""python -m utils.training [--config slow|fast] [--steps 30] [--nvtx] ...: lesson 03's loop outside Jupyter, e.g.
under `nsys profile` (its Nsight section)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

import torch

from utils.core import env
from utils.core.data import image_data
from utils.training import profiling
from utils.training.loop import LoopConfig, Trainer


def main(argv=None) -> int:
    """Run the loop outside Jupyter, e.g. under `nsys profile` (lesson 03's Nsight section)."""
    parser = argparse.ArgumentParser(prog="python -m utils.training", description="lesson 03 training loop")
    parser.add_argument("--config", choices=["slow", "fast"], default="fast")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=4)
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--nvtx", action="store_true", help="emit NVTX ranges per phase (and per op via emit_nvtx)")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)


    device = env.choose_device(args.device)
    config = LoopConfig() if args.config == "slow" else LoopConfig.fast(num_workers=args.num_workers, amp=args.amp)
    profiling.set_nvtx(args.nvtx)
    images = image_data.synthetic_cifar(1024)
    dataset = image_data.AugmentedImages(images, image_size=args.image_size, length=args.steps * args.batch_size)
    with Trainer(dataset, config, batch_size=args.batch_size, device=device) as trainer:
        trainer.run(min(3, args.steps))  # warm-up outside the capture range
        nvtx_ctx = torch.autograd.profiler.emit_nvtx() if args.nvtx and device.type == "cuda" else contextlib.nullcontext()
        capture = torch.cuda.profiler.profile() if device.type == "cuda" else contextlib.nullcontext()
        t0 = time.perf_counter()
        with capture, nvtx_ctx:
            trainer.run(max(1, args.steps - 3))
            if device.type == "cuda":
                torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        losses = trainer.losses()
    print(f"{config.describe()}: {seconds / max(1, args.steps - 3) * 1e3:.1f} ms/step, last loss {losses[-1]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
