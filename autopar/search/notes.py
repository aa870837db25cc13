"""What an answer should say about the problem it answers (issue 21): the default batch.

autopar trains 4 Mi tokens per step when no batch is given (``DEFAULT_GLOBAL_BATCH_TOKENS``).
On a large cluster that leaves few micro-batches per data-parallel replica: at 2,048 GPUs it is
two, so no pipeline can pay for its bubble, and the answer reflects autopar's default rather
than the job. The note fires when the answer's gradient accumulation is below 2, or, with a
pipeline, below ``MICROBATCHES_PER_PIPELINE`` (the bubble of 1F1B is ``(pp - 1)`` of
``grad_accum + pp - 1`` micro-batch slots, Narayanan et al. 2021 §2.2: with 3 micro-batches and
4 stages half the step is bubble).
"""

from __future__ import annotations

from autopar.inputs.problem import DEFAULT_GLOBAL_BATCH_TOKENS
from autopar.inputs.specs import Problem
from autopar.layout.plan import Layout

MICROBATCHES_PER_PIPELINE = 4


def default_batch_note(problem: Problem, layout: Layout | None) -> str | None:
    """The note about the default batch for an answer with ``layout`` (``None`` when nothing
    fits), or ``None`` when the batch was given or leaves enough micro-batches."""
    training = problem.training
    if not training.default_batch:
        return None
    head = (
        f"the global batch is autopar's default, {DEFAULT_GLOBAL_BATCH_TOKENS:,} tokens "
        f"({training.global_batch_sequences:,} x {training.seq_len:,})"
    )
    tail = "; give the job's --global-batch or --global-batch-tokens"
    if layout is None:
        return head + tail
    ga, pp = layout.grad_accum, layout.pp
    if ga < 2:
        return f"{head}: gradient accumulation {ga} on {training.num_gpus:,} GPUs{tail}"
    if pp > 1 and ga < MICROBATCHES_PER_PIPELINE:
        return (
            f"{head}: {ga} micro-batches per step for a {pp}-stage pipeline, fewer than "
            f"{MICROBATCHES_PER_PIPELINE}{tail}"
        )
    return None
