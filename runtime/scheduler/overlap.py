"""Overlap scheduling: when it is on, and which steps must still run synchronously (scheduler
process).

With overlap, step N+1 is planned and launched before step N's sampled tokens are committed, so
the host work of a step (planning, admission, radix matching, output handling) runs while the
device computes the next one. The pipeline is the same in both modes (`Scheduler.step`): only
when the result processor commits a step changes.
  1. plan step N+1 over the running set as if step N's tokens were known: a request sampled at N
     has `pending_sample` set (its sequence is one token longer; that token reads as
     PENDING_TOKEN on the host and is taken from `future_ids`, on the device, at launch);
  2. launch N+1's forward (on a GPU the kernels are queued, nothing waits);
  3. commit step N: wait for its token ids (the step's one host synchronisation, its copy queued
     behind N's sampling), accept them, check finishes, release KV, queue outputs;
  4. sample N+1 (its penalties and seeds see N's tokens) and leave the ids in `future_ids`.
A request that finished at N may already sit in N+1: its token there is dropped (its KV slot
holds the KV of its last real token, which is valid). Outputs are identical with overlap on and
off; each token reaches the client one iteration later.

Constrained requests overlap too: step N is committed (its tokens accepted by their grammars)
before step N+1 is sampled, so N+1's masks see N's tokens. When committing N changes a request's
sequence beyond its new token (jump-forward appends forced text, a checked value rolls back),
the token N+1 ran for it is stale: N+1 draws it but drops it (`LaunchedStep.stale`), like the
token of a request that finished at N, and the next step runs the new tail as an extend.

A step is synchronous (the step in flight is committed before it is planned) when the pool may
be too short for the decodes, when a waiting request may preempt a running one (retraction must
see settled requests), or, with speculative decoding, while a running request may draft (a draft
follows the sequence's last token, which must be on the host: those steps run one by one, the
others overlap; at `--speculative-max-verify-tokens` decoding requests or more no step drafts,
so they overlap too). A step that carries drafts anyway (a request re-admitted with output) is
committed at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixgen.runtime.scheduler.scheduler import Scheduler
    from radixgen.server_args import ServerArgs


def overlap_enabled(args: ServerArgs, device: str) -> bool:
    """Overlap scheduling: on by default on CUDA, on CPU only when asked (it hides nothing
    there)."""
    sched = args.scheduler
    if sched.disable_overlap_schedule:
        return False
    return device.startswith("cuda") or sched.enable_overlap_schedule


def needs_sync(s: Scheduler) -> bool:
    """Whether this step must see every sampled token on the host before it is planned."""
    decodes = [r for r in s.running if r.pending_len == 1]
    drafts = s.drafts
    if (
        drafts is not None
        and len(decodes) < drafts.cfg.speculative_max_verify_tokens  # else none is drafted
        and any(drafts.drafting_kind(r) for r in s.running)
    ):
        return True  # a draft follows the sequence's last token: it must be on the host
    planner = s.planner
    if planner.preemption_candidate() is not None:
        return True  # a preemption retracts, and retraction must see settled requests
    return bool(decodes) and not planner.free_tokens(planner.pages(decodes, 1) * s.page_size)
