"""The pipeline schedules each framework ships (``FRAMEWORK_SCHEDULES``), with where they are
defined; ``autopar.layout.schedule_rules`` holds what each schedule needs of a layout."""

from __future__ import annotations

FRAMEWORK_SCHEDULES: dict[str, tuple[tuple[str, str], ...]] = {
    "megatron": (
        ("1f1b", "megatron/core/pipeline_parallel/schedules.py (1F1B; interleaved with VPP)"),
        (
            "combined-1f1b",
            "--overlap-moe-expert-parallel-comm, pipeline_parallel/combined_1f1b.py",
        ),
    ),
    "torchtitan": tuple(
        (name, f"torch.distributed.pipelining.schedules.get_schedule_class({cls!r})")
        for name, cls in (
            ("1f1b", "1F1B / Interleaved1F1B"),
            ("zb-h1", "InterleavedZeroBubble"),
            ("zb-v", "ZBVZeroBubble"),
            ("dualpipe-v", "DualPipeV"),
            ("gpipe", "GPipe"),
            ("looped-bfs", "LoopedBFS"),
        )
    ),
    "deepspeed": (("1f1b", "deepspeed/runtime/pipe/engine.py L501 (TrainSchedule only)"),),
}
"""The pipeline schedules each framework ships, with where (Megatron-LM main of 2026-08;
torchtitan runs every schedule ``torch.distributed.pipelining`` names, torch 2.14
``schedules.py`` L3878-3904; DeepSpeed 0.19.8's pipe engine runs 1F1B only). Megatron-LM has no
zero-bubble or DualPipe schedule (its ``--delay-wgrad-compute`` only serves the combined 1F1B,
transformer_config.py L3074-3077)."""
