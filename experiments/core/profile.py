"""The compute-profile record type (what `ddpbench profile` measures, read back as medians) and the one
rule for choosing a profile among records: same model, inputs, device and threads; as many co-located
copies as the config has ranks, else one copy; the newest, or the one measured nearest to a given time."""
from __future__ import annotations

import calendar
import dataclasses
import hashlib
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from experiments.core.records import LATER_FIELDS, read_records


@dataclass(frozen=True)
class Profile:
    """Medians of a profile record: what the simulation replays (seconds, bytes)."""

    model: str
    forward: float
    backward: float  # first gradient hook to the last: computation and copies into buckets
    ready: tuple[float, ...]  # per parameter, seconds after backward started
    tail: float  # after backward at world size 1: the wait (nothing to wait for) and the write-back
    optimizer: float
    skipped_forward: float
    skipped_backward: float
    nbytes: tuple[int, ...]
    dtypes: tuple[str, ...]
    buffer_bytes: int
    config: dict
    scaled_to: dict | None = None  # a profile scaled to a GPU's estimated time (perfmodel.gpus)
    hardware: str | None = None  # the GPU's (device cuda) or CPU's name the record's env gives, where it has one

    @property
    def compute(self) -> float:
        """Seconds of computation in a synchronised iteration: forward, backward, tail, optimizer."""
        return self.forward + self.backward + self.tail + self.optimizer

    def scaled(self, factor: float) -> "Profile":
        """The same model on a device `factor` times slower (< 1: faster): every time scaled alike."""
        return dataclasses.replace(
            self, forward=self.forward * factor, backward=self.backward * factor,
            ready=tuple(t * factor for t in self.ready), tail=self.tail * factor, optimizer=self.optimizer * factor,
            skipped_forward=self.skipped_forward * factor, skipped_backward=self.skipped_backward * factor)

    @classmethod
    def from_record(cls, record: dict) -> "Profile":
        """Summarise a profile record by medians over its iterations."""
        synced, skipped = record["synced"], record["skipped"]

        def median(rows, key):
            return statistics.median(row[key] for row in rows)

        ready = tuple(statistics.median(column) for column in zip(*(row["ready"] for row in synced)))
        return cls(model=record["config"]["model"], forward=median(synced, "forward"),
                   backward=median(synced, "backward"), ready=ready, tail=median(synced, "tail"),
                   optimizer=median(synced, "optimizer"), skipped_forward=median(skipped, "forward"),
                   skipped_backward=median(skipped, "backward"), nbytes=tuple(record["bytes"]),
                   dtypes=tuple(record["dtypes"]), buffer_bytes=record["buffer_bytes"], config=record["config"],
                   scaled_to=record.get("scaled_to"), hardware=_hardware(record))


def _hardware(record: dict) -> str | None:
    """The name of what a profile record was measured on: its env's GPU on CUDA, else its CPU."""
    env = record.get("env") or {}
    return env.get("gpu") if record["config"].get("device") == "cuda" else env.get("cpu")


# What makes two configs share a profile: the model, its inputs, the device and the compute threads.
PROFILE_KEYS = ("model", "device", "batch_size", "image_size", "seq_len", "threads", "model_config", "amp", "model_hash")


def config_value(config: dict, key: str):
    """`config[key]`, or for a field added later the value every older record implies."""
    return config.get(key, LATER_FIELDS.get(key))


def choose_profile_record(candidates: list[dict], copies: int, measured_at: str | None = None) -> dict | None:
    """The one rule for choosing among matching profile records: one measured as `copies` co-located
    copies (ranks sharing a host's cores compute more slowly than a process alone), else a one-copy
    profile; the newest, or with `measured_at` (a record's env time) the one measured nearest to it,
    since a machine's speed drifts between days. None where neither exists."""
    target = _seconds({"env": {"time": measured_at}}) if measured_at is not None else None
    for wanted in (copies, 1):
        same = [r for r in candidates if r["config"]["world_size"] == wanted]
        if same:
            return same[-1] if target is None else min(reversed(same), key=lambda r: abs(_seconds(r) - target))
    return None


def find_profile(records: list[dict], config: dict, measured_at: str | None = None,
                 machine_id: str | None = None) -> Profile | None:
    """The measured profile among `records` whose model, inputs, device and threads match `config`,
    chosen by `choose_profile_record`. Profiles scaled to a GPU (`scaled_to`) are never picked, nor, with
    `machine_id`, a profile that another machine measured (records made before machines had ids match)."""
    matches = [r for r in records if r.get("kind") == "profile" and r["status"] == "ok" and "scaled_to" not in r
               and all(config_value(r["config"], k) == config_value(config, k) for k in PROFILE_KEYS)
               and machine_id in (None, (r.get("env") or {}).get("machine_id", machine_id))]
    chosen = choose_profile_record(matches, config["world_size"], measured_at)
    return None if chosen is None else Profile.from_record(chosen)


def _seconds(record: dict) -> float:
    """A record's measurement time (env.time, UTC) in seconds; 0 where it has none."""
    stamp = (record.get("env") or {}).get("time")
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) if stamp else 0.0


class ComputeProfileError(ValueError):
    """A compute profile that cannot drive the stand-in (missing, or of another model)."""


@dataclass(frozen=True)
class ComputeProfile:
    """The profile a stand-in replays, and where it came from (stored in each record)."""

    profile: Profile
    source: dict


def load_compute_profile(path: str | Path, model: str, world_size: int) -> ComputeProfile:
    """The profile of `model` in `path` that a stand-in at `world_size` ranks replays, chosen by
    `choose_profile_record` (profiles scaled to a GPU included: they drive the scale model), else the
    newest of any copy count."""

    try:
        records = read_records(path)
    except (FileNotFoundError, ValueError) as error:
        raise ComputeProfileError(f"--compute-profile={str(path)!r}: {error}") from None
    mine = [r for r in records if r.get("kind") == "profile" and r.get("status") == "ok"
            and r["config"]["model"] == model]
    if not mine:
        found = sorted({r["config"]["model"] for r in records if r.get("kind") == "profile"})
        raise ComputeProfileError(f"--compute-profile={str(path)!r} holds no profile of --model={model!r}; it has: "
                                  f"{', '.join(found) or 'none'} (make one with `ddpbench profile --model {model}`)")
    record = choose_profile_record(mine, world_size) or mine[-1]
    c = record["config"]
    source = {"file": str(path), "sha256": hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16],
              "device": record.get("scaled_to", {}).get("device", c["device"]), "profiled_on": c["device"],
              "copies": c["world_size"], "batch_size": c["batch_size"], "image_size": c["image_size"],
              "seq_len": c["seq_len"], "scaled_to": record.get("scaled_to"),
              "gpu": (record.get("env") or {}).get("gpu"), "cpu": (record.get("env") or {}).get("cpu")}
    return ComputeProfile(Profile.from_record(record), source)
