"""Profiling the target's steps at engine start, for the verify planner's :class:`.StepCost`.

Each point is a dummy step timed as the engine runs it, from the batch handed to the model to
the draws read back on the host (:mod:`.verify_cost` says why both kinds are needed):

* a plain step of ``R`` single-token rows: the decode pass, one logit per row, one draw each,
  replayed from a CUDA graph where the engine replays its plain steps (``cuda_graphs``: a
  graph of the profile's own slots per row count, captured by the untimed step before the
  count's points and dropped with them);
* a verification step of ``R`` rows holding ``D`` drafts in all (spread evenly): the
  verification pass keeping every logit (replayed from a CUDA graph where the engine's are),
  with the drafter's feature layers captured (or the final streams returned, for a drafter
  that reads those), a draw at every position, and every row rolled back, as the rows that
  rejected drafts are;
* the draws alone: what drawing ``n`` positions at temperature 1 (softmax and noise at every
  position, what a sampled request pays) costs over drawing them greedily, which both passes
  above do.

Row counts are the powers of two up to ``max_num_seqs`` (capped: past the cap the curves are
extrapolated); per row count the drafts are one in all, and one, two and ``k`` a row. Every row
continues the same context of :data:`PROFILE_CONTEXT` tokens (one state run once and cloned),
so the steps attend over a context as serving steps do, and each run is rolled back to it, so
every run starts from the same place. Each row count's points follow an untimed plain step of
that count (a step after one of another size starts cold, which a serving step of a steady
batch does not). The runs of a point are taken in separate passes over all points, and the
fastest of each kept: other work on the machine only ever adds time to a run. Each curve is
then made non-decreasing by pooling adjacent points out of order (the least-squares fit), not
by a running max, which would carry one slow point up to every larger step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from deepinfer.cache.slots import StateSlots
from deepinfer.engine.verify_cost import StepCost, VerifyCost, power_points, spread
from deepinfer.models.batch import ForwardBatch
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.graphs import DecodeGraphs
from deepinfer.models.state import ModelState
from deepinfer.sampling import SamplingTensors
from deepinfer.sampling.sampler import sample

#: Runs per profiled point (the fastest is kept).
PROFILE_REPEATS = 3
#: Most rows a profiled step holds; past it the curves are extrapolated. On a CPU, whose
#: steps are slow and close to linear in rows well before this, start-up stays short.
PROFILE_MAX_ROWS = 256
PROFILE_MAX_ROWS_CPU = 64
#: Most positions whose draws are timed (each holds a row of logits); past it, extrapolated.
PROFILE_MAX_DRAWS = 512
#: Context tokens every profiled row continues (at most the model's positions allow).
PROFILE_CONTEXT = 1024
PROFILE_CONTEXT_CPU = 128


def draft_counts(rows: int, k: int) -> list[int]:
    """The drafts in all of the verification steps profiled at ``rows`` rows: one, and one,
    two and ``k`` a row."""
    return sorted({1, *(rows * d for d in (1, min(2, k), k))})


@torch.no_grad()
def profile_step_cost(
    model: DeepseekCausalLM,
    num_speculative_tokens: int,
    max_num_seqs: int,
    feature_layers: Sequence[int] = (),
    repeats: int = PROFILE_REPEATS,
    *,
    cuda_graphs: bool = False,
) -> StepCost:
    """Time plain and verification steps of ``model`` (see the module) for up to
    ``max_num_seqs`` rows of up to ``num_speculative_tokens`` drafts each; plain steps from
    CUDA graphs with ``cuda_graphs``."""
    k = num_speculative_tokens
    cpu = model.device.type == "cpu"
    levels = power_points(
        max(1, min(max_num_seqs, PROFILE_MAX_ROWS_CPU if cpu else PROFILE_MAX_ROWS))
    )
    shapes = {r: [(r, d) for d in (0, *draft_counts(r, k))] for r in levels}
    graphs = DecodeGraphs(levels[-1]) if cuda_graphs else None
    if graphs is not None:  # the engine's rows (the states here keep one more token)
        graphs.verify_width = k + 1
    steps = _DummySteps(model, levels[-1], k, feature_layers, graphs)
    # draws with noise cost close to linearly in positions: 1, 8, 64, ... suffice
    positions = power_points(min(levels[-1] * (k + 1), PROFILE_MAX_DRAWS), base=8)
    runs: dict[tuple[int, int], list[float]] = {s: [] for r in levels for s in shapes[r]}
    noisy: dict[int, list[tuple[float, float]]] = {n: [] for n in positions}
    try:
        for _ in range(repeats):  # whole passes: a burst of load spoils one run per point
            for r in levels:
                steps.run(r, 0)  # untimed: a step after one of another size starts cold
                for shape in shapes[r]:
                    runs[shape].append(steps.run(*shape))
            steps.draws(positions[0])
            for n in positions:
                noisy[n].append(steps.draws(n))
    finally:
        steps.close()
    fastest = {shape: min(r) for shape, r in runs.items()}
    extra = {n: min(t for t, _ in r) - min(g for _, g in r) for n, r in noisy.items()}
    draws = monotone_curve({n: max(s, 1e-9) for n, s in extra.items()})
    plain = monotone_curve({r: fastest[r, 0] for r in levels})
    verify = tuple(
        monotone_curve(
            {r + d: max(fastest[r, d], plain.step_seconds(r)) for d in draft_counts(r, k)}
        )
        for r in levels
    )
    return StepCost(plain, verify, tuple(levels), draws)


def monotone_curve(points: dict[int, float]) -> VerifyCost:
    """The non-decreasing curve closest to ``points`` (least squares: adjacent points out of
    order are pooled into their mean). A running max would carry one slow point up to every
    larger count; pooling spreads it over its neighbours instead."""
    blocks: list[list[float]] = []  # [mean, weight]
    for _, s in sorted(points.items()):
        blocks.append([s, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m0, w0), (m1, w1) = blocks.pop(-2), blocks.pop()
            blocks.append([(m0 * w0 + m1 * w1) / (w0 + w1), w0 + w1])
    values = [m for m, w in blocks for _ in range(int(w))]
    return VerifyCost.from_table(dict(zip(sorted(points), values, strict=True)))


class _DummySteps:
    """Slot states that continue one context, and timed steps over them."""

    def __init__(
        self,
        model: DeepseekCausalLM,
        rows: int,
        k: int,
        feature_layers: Sequence[int],
        graphs: DecodeGraphs | None,
    ) -> None:
        self.model = model
        self.layers = tuple(feature_layers)
        self.graphs = graphs  # plain steps replay these (None: eager)
        cfg = model.cfg
        wanted = PROFILE_CONTEXT_CPU if model.device.type == "cpu" else PROFILE_CONTEXT
        self.context = max(0, min(wanted, cfg.max_position_embeddings - k - 2))
        image = cfg.image_token_id
        top = cfg.vocab_size if image is None else min(cfg.vocab_size, image)
        gen = torch.Generator().manual_seed(0)
        self.ids = torch.randint(3, top, (self.context + rows * (k + 1),), generator=gen)
        self.history = self.ids[: self.context].tolist()
        self.slots = StateSlots(
            lambda: model.new_state(1, slack=k + 1),
            max_slots=rows,
            max_len=self.context + k + 2,
            initial_slots=rows,
        )
        first = self.slots.new_state()
        if self.context:
            model(ForwardBatch.build([self.ids[: self.context]], [first]))
        self.states = [first, *(self.slots.clone(first) for _ in range(rows - 1))]
        shape = (min(rows * (k + 1), PROFILE_MAX_DRAWS), cfg.vocab_size)
        self.logits = torch.randn(shape, generator=gen).to(model.device)

    def run(self, rows: int, drafts: int) -> float:
        """Seconds of one step of ``rows`` rows and ``drafts`` drafts (0: a plain step)."""
        used, lengths = self.states[:rows], spread(rows, drafts)
        chunks, start = [], self.context
        for n in lengths:
            chunks.append(self.ids[start : start + n])
            start += n
        streams = bool(drafts) and not self.layers
        batch = ForwardBatch.build(
            chunks, used, lengths if drafts else None, return_streams=streams
        )
        begin = time.perf_counter()
        out = self.model(batch, self.graphs, capture=self.layers if drafts else ())
        logits = out.logits.float()
        greedy = _inputs(logits.shape[0], logits.device, 0.0)
        sample(logits, greedy, ops=self.model.ops).token_ids.tolist()
        if drafts:  # a verification step rolls its rows back to what they kept
            self._rollback(used)
        seconds = time.perf_counter() - begin
        if not drafts:
            self._rollback(used)
        return seconds

    def draws(self, n: int) -> tuple[float, float]:
        """Seconds of drawing ``n`` positions at temperature 1, and greedily (on made-up
        logits)."""
        logits = self.logits[:n]
        seconds = []
        for temperature in (1.0, 0.0):
            inputs = _inputs(n, logits.device, temperature)
            begin = time.perf_counter()
            sample(logits, inputs, ops=self.model.ops).token_ids.tolist()
            seconds.append(time.perf_counter() - begin)
        return seconds[0], seconds[1]

    def _rollback(self, states: Sequence[ModelState]) -> None:
        self.model.rollback_many([(state, self.context, self.history) for state in states])

    def close(self) -> None:
        for state in self.states:
            self.slots.release(state)


def _inputs(n: int, device: torch.device, temperature: float) -> SamplingTensors:
    """Sampling inputs of ``n`` rows at ``temperature`` (0: greedy), no filters."""
    rows = torch.arange(n, device=device)
    return SamplingTensors(
        temperature=torch.full((n,), temperature, device=device),
        top_k=torch.zeros(n, dtype=torch.int64, device=device),
        top_p=torch.ones(n, device=device),
        min_p=torch.zeros(n, device=device),
        seeds=rows,
        positions=rows,
        sampled_rows=rows if temperature > 0 else rows[:0],
        any_top_k_top_p=False,
    )
