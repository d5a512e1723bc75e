"""bucket_cap_mb="auto": ddp_core picks its own bucket cap from what it measures in the first iterations.

What it does, in synchronised iterations (those whose backward reduces gradients; no_sync() ones do not
count), all within `BUDGET` (30) of them:
1. iterations 1-2 (`WARMUP`) run on PyTorch's default caps (25 MB, first bucket 1 MB) and are not
   measured: the first runs on guessed buckets and rebuilds them in arrival order, as usual;
2. iterations 3-7 (`MEASURED`) are timed from the reducer's own hooks: when each gradient is in its
   bucket, when backward compute ends, when synchronisation ends, and the rest of the iteration;
3. at the forward of iteration 8 (`DECIDE_AT`), every rank times a few blocking all-reduces of
   bucket-sized slices of one scratch buffer (the largest bucket's size: the one extra copy this costs)
   and fits `seconds = latency + bytes * per_byte`; the ranks combine their figures with an all-reduce
   (MAX: the slowest rank gates every bucket) and rank 0 replays every candidate (cap, first bucket cap)
   on paper with ddp_core's own schedule (`schedule.replay`, the one the suite's performance model
   uses) and broadcasts a shortlist: the measured layout and the model's `SHORTLIST - 1` best others;
4. from iteration 8 the measured search tries the shortlist in rounds: a visit re-buckets, lets one
   iteration settle on the new buckets and times the next two, forward to forward (all the user's loop
   does). Round 1 visits every shortlisted layout and names the leader (the fastest other one); rounds 2
   and 3 visit the leader and the measured layout only, in alternating order (so a drift in the machine's
   speed favours no one). After each round the ranks all-reduce its medians (MAX: the slowest rank sets
   the pace), so every rank applies the same rule to the same figures and ranks never disagree;
5. the rule (`search_verdict`): the unit of replication is a round (iterations of one visit are not
   independent), so the leader replaces the measured layout only if, over the three rounds, the t 95%
   interval of its ratio to the measured layout lies below 1 and the geometric mean is at least
   `MIN_MEASURED_GAIN` (2%) below 1. The search stops early, keeping the measured layout, where round 1
   finds no layout 2% faster or a later round finds the leader no faster. So the evidence a switch needs
   follows the spread the machine shows: on a quiet machine a few per cent are found; on a noisy one the
   measured layout stays, and a switch on noise happens in at most 4.5% of searches at spreads of 1-15% (the
   unit test simulates it). The choice comes at the forward of iteration 17, 23 or 29, within `BUDGET`;
   then tuning is over: no more stamps on the hot path.

Why a model and then a measured search, not either alone: the model ranks tens of candidates from
milliseconds of probing, but its error (a fitted cost, one of two schedule models, medians of five
iterations) is often larger than the gains it predicts (measured on two CPU ranks: docs/ddp_core.md). A
measured search over all candidates would need one re-bucketing and several noisy iterations each (more
than the budget), and iterations at bad caps cost the user. So the model proposes few and the clock decides among them. Two
schedule models are considered: communication beside compute (GPUs, or spare CPU cores: buckets overlap
backward) and communication on the compute cores (nothing overlaps: each call adds its time); the one
whose prediction for the measured layout is closer to the measured iteration ranks the candidates, and
the other model's best is shortlisted too. Gradients are exactly those of a fixed cap: only which
gradients share a bucket changes.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, replace
from typing import Sequence

import torch
import torch.distributed as dist

from .bucketing import MB, TensorSpec, assign_buckets
from .schedule import replay

BUDGET = 30  # synchronised iterations within which the cap is chosen (the switch comes well before)
WARMUP = 2  # not measured: iteration 1 runs on guessed buckets, iteration 2 first on rebuilt ones
MEASURED = 5  # timed iterations; medians over them
DECIDE_AT = WARMUP + MEASURED + 1  # the synchronised forward that chooses and re-buckets
assert DECIDE_AT <= BUDGET
DEFAULT_CAP_MB, DEFAULT_FIRST_CAP_MB = 25.0, 1.0  # PyTorch's; the cap used while measuring
# A change of layout must be predicted to save more than this share of the measured iteration (and more
# than the model's own error on the measured layout): medians of MEASURED iterations and a fitted cost
# are not exact, and a switch on noise would trade the known layout for an unknown one.
MIN_GAIN = 0.03
SHORTLIST = 3  # layouts the measured search tries: the measured one and the model's two best others
SEARCH_ROUNDS = 3  # round 1 over the shortlist; rounds 2 and 3 over the leader and the measured layout
VISIT = 3  # iterations per visit to a layout: one settles on the new buckets, two are timed
# the search iterations after which it can choose (after round 1, 2 or 3; the most is SEARCH_ITERATIONS)
SEARCH_STOPS = tuple((SHORTLIST + 2 * k) * VISIT for k in range(SEARCH_ROUNDS))
SEARCH_ITERATIONS = SEARCH_STOPS[-1]
assert DECIDE_AT - 1 + SEARCH_ITERATIONS <= BUDGET
# The leader must be measured at least this much faster than the measured layout (the geometric mean over
# rounds) besides its interval lying below 1: a gain too small to matter is not worth an unknown layout.
MIN_MEASURED_GAIN = 0.02
# The 97.5% quantile of Student's t with SEARCH_ROUNDS - 1 degrees of freedom (scipy.stats.t.ppf(0.975, 2);
# a unit test checks it): the bound of a two-sided 95% interval over three rounds. A constant because
# ddp_core imports torch alone.
T_975 = 4.302652729749464
TUNING_STATES = ("measuring", "searching")  # the states before the cap is chosen
_STANDARD_CAPS_MB = (0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 200, 400)
_MODELS = ("overlapped", "serial")


@dataclass(frozen=True)
class AllReduceCost:
    """Seconds of one all-reduce of `nbytes`: `latency + per_byte * nbytes` (fitted by `fit`)."""

    latency: float
    per_byte: float

    def seconds(self, nbytes: float) -> float:
        """Predicted seconds of one all-reduce of `nbytes`."""
        return self.latency + self.per_byte * nbytes

    @classmethod
    def fit(cls, sizes: Sequence[float], seconds: Sequence[float]) -> "AllReduceCost":
        """Least-squares line through (bytes, seconds), neither term below 0 (noise can tilt a line)."""
        if len(sizes) != len(seconds) or not sizes:
            raise ValueError(f"sizes and seconds must be equally long and non-empty, got {len(sizes)} and {len(seconds)}")
        n, mean_x, mean_y = len(sizes), sum(sizes) / len(sizes), sum(seconds) / len(seconds)
        var = sum((x - mean_x) ** 2 for x in sizes)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(sizes, seconds)) / var if var > 0 else 0.0
        slope = max(0.0, slope)
        return cls(latency=max(0.0, mean_y - slope * mean_x), per_byte=slope)


@dataclass(frozen=True)
class Candidate:
    """One (cap, first cap) replayed: its bucket count, predicted exposed communication and iteration."""

    cap_mb: float
    first_cap_mb: float
    buckets: int
    exposed: float  # seconds
    predicted: float  # seconds per iteration


@dataclass(frozen=True)
class Trial:
    """One shortlisted layout as the search measured it: the slowest rank's median seconds per iteration."""

    cap_mb: float
    first_cap_mb: float
    seconds: float  # the median of its round figures
    iterations: int  # timed iterations behind them
    rounds: tuple[float, ...] = ()  # per round it was visited in: the slowest rank's median seconds


@dataclass(frozen=True)
class Verdict:
    """The measured search after some rounds: `winner` (a shortlist slot: 0 is the measured layout) once
    decided, else None and the slots of the next round; the leader's ratios to the measured layout per
    round, their geometric mean and t 95% interval (after the last round), and why, in words."""

    winner: int | None
    next_round: tuple[int, ...] = ()
    leader: int | None = None
    ratios: tuple[float, ...] = ()
    ratio: float | None = None
    interval: tuple[float, float] | None = None
    why: str = ""


@dataclass(frozen=True)
class Decision:
    """The chosen caps, the schedule model used, every candidate's prediction and, after the measured
    search, every shortlisted layout's measured iteration (why)."""

    cap_mb: float
    first_cap_mb: float
    model: str  # "overlapped" (communication beside compute) or "serial" (on the compute cores)
    candidates: tuple[Candidate, ...]
    margin: float = 0.0  # seconds a candidate had to save against the measured layout (candidates[0])
    kept: bool = False  # no candidate saved more: the measured layout stays
    trials: tuple[Trial, ...] = ()  # the measured search, the measured layout first; () for the model alone
    verdict: Verdict | None = None  # the measured search's last verdict

    def reason(self) -> str:
        """Why these caps, in one sentence, against the measured layout (the first candidate)."""
        measured = self.candidates[0]
        if self.trials and self.verdict is not None:
            caps = f"{self.cap_mb:g}/{self.first_cap_mb:g} MB"
            return f"{'kept' if self.kept else 'chose'} {caps}: {self.verdict.why}"
        best = min(self.candidates, key=lambda c: c.predicted)
        gain = (measured.predicted - best.predicted) * 1e3
        if self.kept:
            return (f"kept {measured.cap_mb:g}/{measured.first_cap_mb:g} MB: the best candidate predicts "
                    f"{gain:.3f} ms less, within the margin of {self.margin * 1e3:.3f} ms")
        return (f"{self.cap_mb:g}/{self.first_cap_mb:g} MB predicts {gain:.3f} ms less than the measured "
                f"{measured.cap_mb:g}/{measured.first_cap_mb:g} MB, more than the margin of {self.margin * 1e3:.3f} ms")

    def describe(self) -> str:
        """`cap/first MB: predicted ms (buckets)` per candidate, in candidate order."""
        return "; ".join(f"{c.cap_mb:g}/{c.first_cap_mb:g} MB: {c.predicted * 1e3:.3f} ms ({c.buckets} buckets)"
                         for c in self.candidates)

    def describe_trials(self) -> str:
        """`cap/first MB: measured ms (n iterations)` per layout the search tried, in shortlist order (the
        median of its round figures)."""
        return "; ".join(f"{t.cap_mb:g}/{t.first_cap_mb:g} MB: {t.seconds * 1e3:.3f} ms ({t.iterations} iterations)"
                         for t in self.trials)


def candidate_caps(specs: Sequence[TensorSpec], order: Sequence[int], first_cap_mb: float = DEFAULT_FIRST_CAP_MB,
                   measured: tuple[float, float] | None = None) -> list[tuple[float, float]]:
    """(cap, first cap) pairs worth replaying, one per distinct bucket layout: `measured` (the caps the
    iterations ran on) first where given, then the others, largest cap first.

    Caps: the usual MB values and the model's size halved up to 6 times (a small model gets choices too);
    first caps: `first_cap_mb`, a quarter of the cap, and the cap itself (no small first bucket)."""
    total_mb = sum(s.nbytes for s in specs) / MB
    caps = {c for c in _STANDARD_CAPS_MB if c < total_mb} | {total_mb / 2 ** k for k in range(7)}
    seen, pairs = set(), []
    if measured is not None:
        seen.add(tuple(map(tuple, assign_buckets(specs, order, *measured))))
        pairs.append(tuple(measured))
    for cap in sorted(caps, reverse=True):
        for first in sorted({min(first_cap_mb, cap), cap / 4, cap}, reverse=True):
            layout = tuple(map(tuple, assign_buckets(specs, order, cap, first)))
            if layout not in seen:
                seen.add(layout)
                pairs.append((cap, first))
    return pairs


def predict(specs: Sequence[TensorSpec], order: Sequence[int], ready: Sequence[float], backward: float,
            cost: AllReduceCost, cap_mb: float, first_cap_mb: float, model: str = "overlapped",
            channels: int = 1, overlap: bool = True) -> tuple[float, int]:
    """(exposed communication in seconds, bucket count) of one layout; `ready[i]`: seconds after the first
    gradient at which parameter i's gradient is in its bucket; `backward`: when the last one is."""
    if model not in _MODELS:
        raise ValueError(f"model must be one of {_MODELS}, got {model!r}")
    assignment = assign_buckets(specs, order, cap_mb, first_cap_mb)
    buckets = [{"bytes": sum(specs[i].nbytes for i in indices),
                "ready": max(ready[i] for i in indices) if overlap else backward} for indices in assignment]
    if model == "serial":  # the cores that compute also communicate: every call adds its time
        return sum(cost.seconds(b["bytes"]) for b in buckets), len(buckets)
    done = replay(buckets, cost.seconds, cost.latency, channels)
    return max(0.0, done - backward), len(buckets)


def shortlist(decision: Decision, other: Decision, size: int = SHORTLIST) -> list[int]:
    """Indices into `decision.candidates` for the measured search: the measured layout (0), the best other
    candidate of the model that ranks (`decision`), the best of the other model (`other`, over the same
    candidates), then the ranking model's next best, until `size` (fewer if there are fewer layouts)."""
    def ranked(d: Decision) -> list[int]:
        return sorted(range(len(d.candidates)), key=lambda k: (d.candidates[k].predicted, -d.candidates[k].cap_mb))

    own, theirs = [k for k in ranked(decision) if k != 0], [k for k in ranked(other) if k != 0]
    picks = [0]
    for k in own[:1] + theirs[:1] + own:
        if len(picks) == size:
            break
        if k not in picks:
            picks.append(k)
    return picks


def search_verdict(rounds: Sequence[dict[int, float]], caps: Sequence[str] | None = None,
                   min_gain: float = MIN_MEASURED_GAIN, needed: int = SEARCH_ROUNDS) -> Verdict:
    """The measured search's rule, after each round: `rounds[k]` maps the shortlist slots visited in round
    k + 1 to their seconds per iteration (slot 0: the measured layout); `caps` names the slots in `why`.

    Round 1 names the leader (the fastest other slot; ties to the earlier). The measured layout stays at
    once where the leader is not `min_gain` faster in round 1, or no faster in a later round. After
    `needed` rounds the leader wins only if the t 95% interval of its ratio over rounds lies below 1 and
    the geometric mean is at least `min_gain` below 1. Otherwise the next round visits the leader and the
    measured layout, the order alternating."""
    if needed != SEARCH_ROUNDS:  # T_975 holds for SEARCH_ROUNDS rounds only
        raise ValueError(f"needed must be {SEARCH_ROUNDS} (T_975's degrees of freedom), got {needed}")
    name = (lambda k: caps[k]) if caps is not None else (lambda k: f"layout {k}")
    first = rounds[0]
    others = sorted(k for k in first if k != 0)
    if not others:
        return Verdict(0, why="the only layout")
    leader = min(others, key=lambda k: (first[k], k))
    ratios = tuple(r[leader] / r[0] for r in rounds)
    said = f"{name(leader)} / {name(0)} per round: " + ", ".join(f"{q:.3f}" for q in ratios)
    if ratios[0] >= 1 - min_gain:
        return Verdict(0, leader=leader, ratios=ratios,
                       why=f"no layout measured {min_gain:.0%} faster in round 1 (the fastest, {said})")
    if any(q >= 1 for q in ratios[1:]):
        return Verdict(0, leader=leader, ratios=ratios, why=f"{name(leader)} measured no faster in a later round ({said})")
    if len(rounds) < needed:
        return Verdict(None, (leader, 0) if len(rounds) % 2 == 1 else (0, leader), leader, ratios)
    logs = [math.log(q) for q in ratios]
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = T_975 * sd / math.sqrt(len(logs))
    ratio, interval = math.exp(mean), (math.exp(mean - half), math.exp(mean + half))
    figures = f"{said}; geometric mean {ratio:.3f} [{interval[0]:.3f}, {interval[1]:.3f}] (t 95% over {len(logs)} rounds)"
    if interval[1] < 1 and ratio <= 1 - min_gain:
        return Verdict(leader, (), leader, ratios, ratio, interval, f"measured faster: {figures}")
    short = "its interval reaches 1" if interval[1] >= 1 else f"less than {min_gain:.0%} faster"
    return Verdict(0, (), leader, ratios, ratio, interval, f"{name(leader)} not shown faster, {short}: {figures}")


def choose_model(specs, order, ready, backward, cost, measured_exposed: float, cap_mb: float, first_cap_mb: float,
                 channels: int = 1, overlap: bool = True) -> str:
    """The schedule model whose exposed communication for the measured layout is closest to the measured one."""
    errors = {model: abs(predict(specs, order, ready, backward, cost, cap_mb, first_cap_mb, model, channels,
                                 overlap)[0] - measured_exposed) for model in _MODELS}
    return min(_MODELS, key=errors.__getitem__)  # a tie keeps "overlapped", listed first


def choose_cap(specs: Sequence[TensorSpec], order: Sequence[int], ready: Sequence[float], backward: float,
               cost: AllReduceCost, rest: float = 0.0, model: str = "overlapped", channels: int = 1,
               overlap: bool = True, first_cap_mb: float = DEFAULT_FIRST_CAP_MB,
               candidates: Sequence[tuple[float, float]] | None = None, margin: float | None = None) -> Decision:
    """The (cap, first cap) with the lowest predicted iteration `rest + backward + exposed communication`.

    Pure: sizes (`specs`, bucketed in `order` as the reducer would), ready times, the all-reduce cost
    and the schedule model in, a decision out. Equal predictions go to the larger cap (fewer calls).
    With a `margin` (seconds), the first candidate is the measured layout, and it stays unless the best
    one predicts more than `margin` less."""
    if len(ready) != len(specs):
        raise ValueError(f"ready must hold one time per parameter ({len(specs)}), got {len(ready)}")
    pairs = list(candidates) if candidates is not None else candidate_caps(specs, order, first_cap_mb)
    results = []
    for cap, first in pairs:
        exposed, count = predict(specs, order, ready, backward, cost, cap, first, model, channels, overlap)
        results.append(Candidate(cap, first, count, exposed, rest + backward + exposed))
    best = min(range(len(results)), key=lambda k: (results[k].predicted, -results[k].cap_mb))
    kept = margin is not None and results[best].predicted > results[0].predicted - margin
    chosen = results[0] if kept else results[best]
    return Decision(chosen.cap_mb, chosen.first_cap_mb, model, tuple(results), margin or 0.0, kept)


class _Clock:
    """Time stamps that mean device time: perf_counter on the CPU, CUDA events on a GPU (read after a sync)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def stamp(self):
        """Now (a float, or a recorded CUDA event)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def since(self, origin, stamp) -> float:
        """Seconds from `origin` to `stamp` (on CUDA, once both events completed)."""
        return origin.elapsed_time(stamp) / 1e3 if self.cuda else stamp - origin

    def sync(self) -> None:
        """Wait for the device (a sync point: tuning iterations only)."""
        if self.cuda:
            torch.cuda.synchronize()


class AutoBucket:
    """The tuner of one reducer: a reducer observer while measuring, the model's shortlist, a measured
    search among it, then the chosen layout.

    Entry point: `before_forward()`, called by DistributedDataParallel at each synchronised forward."""

    def __init__(self, reducer):
        self.reducer = reducer
        self.clock = _Clock(reducer.params[0].device)
        self.first_cap_mb = reducer.first_bucket_cap_mb  # the user's: one of the first caps considered
        self.iterations = 0  # finished synchronised iterations
        self.state = "measuring"  # then "searching", "chosen", or "stopped: <why>"
        self.decision: Decision | None = None  # the model's while searching, the final one once chosen
        self.decided_after: int | None = None  # synchronised iterations before the final layout
        self.tuning_seconds = 0.0  # this rank's time in the decisions (probe, collectives, re-bucketings)
        self._samples: list[dict] = []  # per measured iteration: ready, backward, exposed, rest
        self._stamps: dict = {}
        self._previous_synced = None
        # the measured search: the shortlisted (cap, first cap) pairs, the current round's iterations as
        # (shortlist slot, timed?), per slot the (start, end) stamps of this round's timed iterations, the
        # finished rounds' combined figures (slot -> seconds) and the search's iterations so far (a slot's
        # timed iterations are VISIT - 1 per round it was visited in)
        self._shortlist: list[tuple[float, float]] = []
        self._schedule: list[tuple[int, bool]] = []
        self._position = 0
        self._timed: dict[int, list[tuple]] = {}
        self._rounds: list[dict[int, float]] = []
        self._searched = 0
        self._running: tuple[int, bool, object] | None = None  # the iteration under way: slot, timed, start
        reducer.tuner = self

    # --- the entry point ---

    def before_forward(self) -> None:
        """At a synchronised forward: stamp it while measuring; at iteration DECIDE_AT, shortlist and start
        the measured search; during the search, time iterations and move between layouts; at its end,
        choose and re-bucket."""
        if self.state == "measuring":
            if self.iterations + 1 >= DECIDE_AT and len(self._samples) >= MEASURED:
                start = time.perf_counter()
                self._shortlist_by_model()
                self.tuning_seconds += time.perf_counter() - start
            else:
                self._stamps = {"forward": self.clock.stamp(), "ready": {}}
                return
        if self.state == "searching":
            self._search_step()

    def stop(self, why: str) -> None:
        """Give up tuning: e.g. under join(), where ranks' iterations differ. A search under way returns to
        the measured layout (a local re-bucketing: every rank stops at the same forward)."""
        if self.state in TUNING_STATES:
            if self.state == "searching":
                self._use(self._shortlist[0])
            self.state = f"stopped: {why}"
            self.reducer.tuner = None

    # --- the reducer observer protocol (called from autograd's threads) ---

    def parameter_ready(self, index: int) -> None:
        """Stamp when parameter `index`'s gradient is in its bucket."""
        ready = self._stamps.get("ready")
        if ready is not None and index not in ready:
            ready[index] = self.clock.stamp()

    def bucket_launched(self, index: int, future) -> None:
        """Not needed: the all-reduce cost comes from the probe, apart from backward's contention."""

    def backward_computed(self) -> None:
        """Stamp the end of backward compute."""
        if "ready" in self._stamps:
            self._stamps["computed"] = self.clock.stamp()

    def gradients_synchronised(self) -> None:
        """One synchronised iteration finished: keep its figures if it is a measured one."""
        self.iterations += 1
        stamps, self._stamps = self._stamps, {}
        synced = self.clock.stamp()
        previous, self._previous_synced = self._previous_synced, synced
        if self.iterations <= WARMUP or "computed" not in stamps or len(stamps["ready"]) != len(self.reducer.params):
            return  # warm-up, or a backward that ddp_core's forward did not stamp
        self.clock.sync()
        since, forward, ready = self.clock.since, stamps["forward"], stamps["ready"]
        first = min(ready.values(), key=lambda s: since(forward, s))
        self._samples.append({
            "ready": [since(first, ready[i]) for i in range(len(self.reducer.params))],
            "backward": since(first, stamps["computed"]),
            "exposed": since(stamps["computed"], synced),
            # forward, loss and backward before the first gradient, plus the optimizer step (and anything
            # else) between the previous iteration's synchronisation and this forward
            "rest": since(forward, first) + (since(previous, forward) if previous is not None else 0.0),
        })

    # --- the decision ---

    def _specs(self) -> list[TensorSpec]:
        r = self.reducer
        return [TensorSpec(p.numel() * p.element_size(), (p.dtype, p.device), sparse) for p, sparse in zip(r.params, r.sparse)]

    def local_figures(self) -> dict:
        """This rank's medians over the measured iterations and its probe's all-reduce times."""
        n = len(self.reducer.params)
        samples = self._samples[-MEASURED:]
        sizes, seconds = self._probe()
        return {"ready": [statistics.median(s["ready"][i] for s in samples) for i in range(n)],
                **{key: statistics.median(s[key] for s in samples) for key in ("backward", "exposed", "rest")},
                "sizes": sizes, "seconds": seconds}

    def _probe(self) -> tuple[list[float], list[float]]:
        """Time blocking all-reduces of slices of one scratch buffer as large as the largest bucket."""
        r = self.reducer
        flats = [b.flat for b in r.buckets if not b.sparse]
        largest = max(flats, key=lambda f: f.numel() * f.element_size())
        scratch = torch.zeros_like(largest)  # the one extra copy of the largest bucket
        group = r.groups[0]
        counts = sorted({max(1, round(scratch.numel() * f)) for f in (1 / 64, 1 / 16, 1 / 4, 1 / 2, 1)})
        dist.all_reduce(scratch[:counts[0]], group=group)  # untimed: the first call of a size pays set-up
        sizes, seconds = [], []
        for count in counts:
            times = []
            for _ in range(3):
                self.clock.sync()
                start = time.perf_counter()
                dist.all_reduce(scratch[:count], group=group)
                self.clock.sync()
                times.append(time.perf_counter() - start)
            sizes.append(float(count * scratch.element_size()))
            seconds.append(statistics.median(times))
        del scratch
        return sizes, seconds

    def _shortlist_by_model(self) -> None:
        """Probe, combine every rank's figures, let rank 0's model rank the candidates and broadcast its
        shortlist; then the measured search begins (or, with one layout only, the choice is made)."""
        r = self.reducer
        group = r.groups[0]
        mine = self.local_figures()
        # Combine: the slowest rank's figures (it gates every bucket); identical on every rank afterwards.
        packed = torch.tensor([*mine["ready"], mine["backward"], mine["exposed"], mine["rest"], *mine["seconds"]],
                              dtype=torch.float64)
        on_device = packed.to(r.params[0].device)
        dist.all_reduce(on_device, op=dist.ReduceOp.MAX, group=group)
        combined = on_device.cpu().tolist()
        n = len(r.params)
        ready, (backward, exposed, rest), seconds = combined[:n], combined[n:n + 3], combined[n + 3:]
        specs, order = self._specs(), list(r.order)
        measured = (r.bucket_cap_mb, r.first_bucket_cap_mb)
        pairs = candidate_caps(specs, order, self.first_cap_mb, measured)
        # [model's best, model, margin, shortlist (-1: none)..., predictions...]
        choice = torch.full((3 + SHORTLIST + len(pairs),), -1.0, dtype=torch.float64)
        if dist.get_rank(group) == 0:
            cost = AllReduceCost.fit(mine["sizes"], seconds)
            channels = len(r.groups)
            model = choose_model(specs, order, ready, backward, cost, exposed, *measured, channels, r.overlap)
            # the model's error on the layout it measured: a predicted gain below it is not believed
            error = abs(predict(specs, order, ready, backward, cost, *measured, model, channels, r.overlap)[0] - exposed)
            margin = max(MIN_GAIN * (rest + backward + exposed), error)
            decide = dict(candidates=pairs, margin=margin)
            decision = choose_cap(specs, order, ready, backward, cost, rest, model, channels, r.overlap, **decide)
            other = choose_cap(specs, order, ready, backward, cost, rest, _MODELS[1 - _MODELS.index(model)],
                               channels, r.overlap, **decide)
            best = next(k for k, c in enumerate(decision.candidates)
                        if (c.cap_mb, c.first_cap_mb) == (decision.cap_mb, decision.first_cap_mb))
            picks = shortlist(decision, other)
            choice[0], choice[1], choice[2] = best, _MODELS.index(model), margin
            choice[3:3 + len(picks)] = torch.tensor(picks, dtype=torch.float64)
            choice[3 + SHORTLIST:] = torch.tensor([c.predicted for c in decision.candidates], dtype=torch.float64)
        on_device = choice.to(r.params[0].device)
        # Rank 0's ranking is everyone's: ranks never disagree about the layouts they try.
        dist.broadcast(on_device, src=dist.get_global_rank(group, 0), group=group)
        choice = on_device.cpu().tolist()
        best, model, margin = int(choice[0]), _MODELS[int(choice[1])], choice[2]
        picks = [int(k) for k in choice[3:3 + SHORTLIST] if k >= 0]
        counts = [len(assign_buckets(specs, order, cap, first)) for cap, first in pairs]
        candidates = tuple(Candidate(cap, first, count, max(0.0, predicted - rest - backward), predicted)
                           for (cap, first), count, predicted in zip(pairs, counts, choice[3 + SHORTLIST:]))
        self.decision = Decision(pairs[best][0], pairs[best][1], model, candidates, margin, kept=best == 0)
        r.tuner = None  # the hooks' measuring is over: no more stamps on the hot path
        self._samples = []
        self._shortlist = [pairs[k] for k in picks]
        if len(self._shortlist) == 1:  # one layout only: nothing to try
            self._finish(Verdict(0, why="the only layout"))
            return
        self._start_round(range(len(self._shortlist)))
        self.state = "searching"

    def _start_round(self, slots) -> None:
        """Schedule one visit per slot: a settling iteration, then VISIT - 1 timed ones."""
        self._schedule = [(slot, step > 0) for slot in slots for step in range(VISIT)]
        self._position = 0
        self._timed = {slot: [] for slot in slots}
        self._running = None

    def _search_step(self) -> None:
        """At a synchronised forward during the search: close the iteration that just ended, then start the
        next on its layout; at a round's end, combine its figures and let `search_verdict` decide or name
        the next round.

        An iteration is timed forward to forward: all the user's loop does, optimizer step included (and any
        no_sync() iterations between two synchronised ones, which bucket layouts do not change)."""
        now = self.clock.stamp()
        if self._running is not None:
            slot, timed, start = self._running
            if timed:
                self._timed[slot].append((start, now))
        if self._position == len(self._schedule):
            start = time.perf_counter()
            verdict = self._end_round()
            if verdict.winner is not None:
                self._finish(verdict)
                self.tuning_seconds += time.perf_counter() - start
                return
            self._start_round(verdict.next_round)
            self.tuning_seconds += time.perf_counter() - start
        slot, timed = self._schedule[self._position]
        self._position += 1
        self._searched += 1
        if not timed:  # a visit begins on another layout
            start = time.perf_counter()
            self._use(self._shortlist[slot])
            self.tuning_seconds += time.perf_counter() - start
        self._running = (slot, timed, self.clock.stamp())

    def round_figures(self) -> dict[int, float]:
        """This rank's median seconds per timed iteration in the round just ended, per slot visited."""
        self.clock.sync()
        return {slot: statistics.median(self.clock.since(a, b) for a, b in stamps) for slot, stamps in self._timed.items()}

    def _end_round(self) -> Verdict:
        """Combine the round's figures over ranks (MAX: the slowest rank sets the pace; identical on every
        rank afterwards) and apply the search's rule to every round so far."""
        mine = self.round_figures()
        slots = sorted(mine)
        r = self.reducer
        on_device = torch.tensor([mine[k] for k in slots], dtype=torch.float64).to(r.params[0].device)
        dist.all_reduce(on_device, op=dist.ReduceOp.MAX, group=r.groups[0])
        self._rounds.append(dict(zip(slots, on_device.cpu().tolist())))
        return search_verdict(self._rounds, [f"{cap:g}/{first:g} MB" for cap, first in self._shortlist])

    def _use(self, caps: tuple[float, float]) -> None:
        """Re-bucket under `caps` unless the buckets already are under them."""
        r = self.reducer
        if (r.bucket_cap_mb, r.first_bucket_cap_mb) != tuple(caps):
            r.rebucket(*caps)

    def _finish(self, verdict: Verdict) -> None:
        """Re-bucket to the verdict's layout (the same on every rank: the same figures, the same rule) and
        note what each shortlisted layout measured."""
        trials = []
        for slot, (cap, first) in enumerate(self._shortlist):
            figures = tuple(r[slot] for r in self._rounds if slot in r)
            if figures:
                trials.append(Trial(cap, first, statistics.median(figures), (VISIT - 1) * len(figures), figures))
        caps = self._shortlist[verdict.winner]
        self._use(caps)
        self.decision = replace(self.decision, cap_mb=caps[0], first_cap_mb=caps[1], kept=verdict.winner == 0,
                                trials=tuple(trials), verdict=verdict if trials else None)
        self.decided_after = DECIDE_AT - 1 + self._searched
        self.state = "chosen"
        self._timed, self._schedule, self._running = {}, [], None

    def logging_data(self) -> dict:
        """What the logging data say about the tuning: its state and, once chosen, the caps and why."""
        figures = {"bucket_cap_auto": 1, "auto_bucket_state": self.state, "auto_bucket_budget_iterations": BUDGET}
        if self.state == "searching":
            figures["auto_bucket_shortlist"] = "; ".join(f"{cap:g}/{first:g} MB" for cap, first in self._shortlist)
        if self.state == "chosen":
            d = self.decision
            figures.update({
                "auto_bucket_cap_mb": d.cap_mb, "auto_first_bucket_cap_mb": d.first_cap_mb,
                "auto_bucket_decided_after_iterations": self.decided_after,
                "auto_bucket_model": d.model,
                "auto_bucket_predictions": d.describe(),
                "auto_bucket_measured": d.describe_trials(),
                "auto_bucket_reason": d.reason(),
                "auto_bucket_tuning_seconds": self.tuning_seconds,
            })
            if d.verdict is not None and d.verdict.ratio is not None:  # the search ran its three rounds
                figures.update({"auto_bucket_search_ratio": d.verdict.ratio,
                                "auto_bucket_search_ci_low": d.verdict.interval[0],
                                "auto_bucket_search_ci_high": d.verdict.interval[1]})
        return figures
