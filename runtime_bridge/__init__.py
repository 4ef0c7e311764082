"""Execute paraplan plans with torch.distributed.pipelining, and profile real layers.

The only package of paraplan that imports torch (architecture.md, dependency direction). This
``__init__`` imports nothing heavy, so that ``runtime_bridge.validate`` (the pre-launch checks)
works without torch; import the submodules you need:

- ``validate``: plan against model and launch, before anything starts (no torch);
- ``model``: the bundled decoder built from a ``TransformerConfig`` (GPT, Llama, Mixtral-style
  MoE); ``stages``: a rank's chunks from a plan, for the bundled model or a user's ordered list
  of blocks; ``parallel``: the (pipeline, data, tensor) device mesh, tensor and sequence
  parallelism (DTensor styles) and data parallelism (DDP or FSDP2 by the plan's ZeRO stage);
  ``expert_parallel``: experts split over replicas, all-to-all dispatch and combine;
  ``context_parallel``: the load-balanced sequence split, attention over all-gathered K/V;
  ``grad_sync``: the explicit data-parallel gradient reduction (zero-bubble orders, EP, CP);
- ``torch_pp``: the adapter over torch's schedule classes and its custom-schedule runtime;
- ``launch``: torchrun launch, per-step progress on stderr; ``report``: measured versus
  predicted; ``check``: the single-process reference; ``worker``: the per-rank program;
- ``profile``: per-layer costs measured on CPU or CUDA, written as a layer profile;
- ``fill``: PipeFill's bubble instruction, a fill job run in a rank's idle waits (docs/pipefill.md);
- ``offload``: SPipe / Mobius / ZeRO-Offload training with CPU-resident master weights and
  optimizer, parameter prefetch and gradient offload (docs/solver-spipe.md, Runtime).

See docs/runtime-bridge.md.
"""
