"""Microbenchmarks for ``paraplan calibrate``: GEMMs, memory copies and attention timed with torch.

The samples go to ``cost_models.calibration``, which fits the device's compute constants; the
result is a cluster file whose ``device.compute`` every solver uses (``--cluster file.json``).
Collective bandwidth is not measured here (it needs a process group over the real links):
pass nccl-tests results to ``cost_models.calibration.fit_collective_fraction`` instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from cost_models.calibration import AttentionSample, CopySample, GemmSample
from planner.errors import InvalidProblemError

DEFAULT_GEMM_SHAPES: tuple[tuple[int, int, int], ...] = (
    (256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
    (8192, 4096, 1024), (2048, 8192, 128), (4096, 1024, 4096),
)
QUICK_GEMM_SHAPES: tuple[tuple[int, int, int], ...] = ((64, 64, 64), (128, 128, 128), (256, 128, 64), (256, 256, 256))
DEFAULT_ATTENTION_SHAPES: tuple[tuple[int, int, int], ...] = ((32, 1024, 128), (16, 2048, 128), (8, 4096, 128),
                                                             (4, 8192, 128))
"""(batch x heads, sequence, head width) of the causal attention samples: 32k tokens of 128-wide heads each."""
QUICK_ATTENTION_SHAPES: tuple[tuple[int, int, int], ...] = ((2, 128, 32), (2, 256, 32))
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_device(device: str) -> None:
    """Refuse a device this torch cannot measure on (a CUDA device without a CUDA build or GPU).

    Raises:
        InvalidProblemError: naming the device and what to use instead.
    """
    if device == "cuda" and not torch.cuda.is_available():
        why = "this torch is a CPU build" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise InvalidProblemError(f"--device cuda: {why}; run on a GPU machine with a CUDA build of torch, "
                                  "or use --device cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_s(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median wall time of ``fn`` after one warm-up call."""
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def _torch_dtype(dev: torch.device, dtype: str) -> torch.dtype:
    """The dtype to measure in: fp16 runs as fp32 on CPU (no fast fp16 kernels there)."""
    return _DTYPES["fp32" if dev.type == "cpu" and dtype == "fp16" else dtype]


def measure_gemms(shapes: Sequence[tuple[int, int, int]] = DEFAULT_GEMM_SHAPES, *, device: str = "cpu",
                  dtype: str = "bf16", repeats: int = 5) -> list[GemmSample]:
    """Time ``torch.matmul`` of (m x k)(k x n) for each shape."""
    dev = torch.device(device)
    torch_dtype = _torch_dtype(dev, dtype)
    warm = torch.randn(256, 256, device=dev, dtype=torch_dtype)
    for _ in range(3):  # thread pools, cuBLAS handles and clocks come up before the first timing
        torch.matmul(warm, warm)
    _sync(dev)
    out = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device=dev, dtype=torch_dtype)
        b = torch.randn(k, n, device=dev, dtype=torch_dtype)
        out.append(GemmSample(m=m, n=n, k=k, seconds=_time_s(lambda: torch.matmul(a, b), dev, repeats)))
    return out


def measure_copies(sizes_bytes: Sequence[int] = (1 << 24, 1 << 26, 1 << 28), *, device: str = "cpu",
                   repeats: int = 5) -> list[CopySample]:
    """Time a device-to-device copy (read + write of the buffer) for each size."""
    dev = torch.device(device)
    out = []
    for size in sizes_bytes:
        src = torch.empty(size // 4, device=dev, dtype=torch.float32).fill_(1.0)
        dst = torch.empty_like(src)
        seconds = _time_s(lambda: dst.copy_(src), dev, repeats)
        out.append(CopySample(num_bytes=2.0 * src.numel() * 4, seconds=seconds))
    return out


def measure_host_copies(sizes_bytes: Sequence[int] = (1 << 26, 1 << 28), *, device: str = "cpu",
                        repeats: int = 5) -> list[CopySample]:
    """Time pinned host-to-device and device-to-host copies (``num_bytes`` one way each), what activation
    offloading moves; none on a CPU device, which has no host link."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return []
    out = []
    for size in sizes_bytes:
        host = torch.empty(size // 4, dtype=torch.float32, pin_memory=True).fill_(1.0)
        on_device = torch.empty(size // 4, device=dev, dtype=torch.float32)
        for copy in (lambda: on_device.copy_(host, non_blocking=True), lambda: host.copy_(on_device, non_blocking=True)):
            out.append(CopySample(num_bytes=float(size // 4 * 4), seconds=_time_s(copy, dev, repeats)))
    return out


def measure_attention(shapes: Sequence[tuple[int, int, int]] = DEFAULT_ATTENTION_SHAPES, *, device: str = "cpu",
                      dtype: str = "bf16", repeats: int = 5) -> list[AttentionSample]:
    """Time causal ``scaled_dot_product_attention`` forward + backward (the kernel torch picks on
    this machine: FlashAttention-2 or cuDNN on recent GPUs, the math path on CPU) for each shape."""
    dev = torch.device(device)
    torch_dtype = _torch_dtype(dev, dtype)
    out = []
    for heads, seq, width in shapes:
        q, k, v = (torch.randn(1, heads, seq, width, device=dev, dtype=torch_dtype, requires_grad=True)
                   for _ in range(3))
        grad = torch.randn(1, heads, seq, width, device=dev, dtype=torch_dtype)

        def step() -> None:
            for t in (q, k, v):
                t.grad = None
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

        out.append(AttentionSample(heads=heads, seq=seq, head_dim=width, seconds=_time_s(step, dev, repeats)))
    return out
