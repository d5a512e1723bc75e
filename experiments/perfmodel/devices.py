"""What a prediction rests on: the device its compute times come from and the device its network is of,
and the warning, given before any figure, where the two differ.

A prediction adds compute times (a profile, or a trace) to communication times (a cluster preset, or
this machine's all-reduce fit). Both must be of one device: a CPU profile on a GPU cluster makes
communication look cheap; a profile scaled to a V100 by a FLOPs estimate, used for an H100 cluster,
is 4x too slow. `--compute-s` (the user's own compute seconds) silences the warning.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from experiments.core.profile import Profile
from experiments.perfmodel.comm import CommModel

# GPU names as families, matched as whole words ("a10" is not "a100", "l4" not "l40").
GPU_FAMILIES = ("v100", "a100", "a10", "a30", "a40", "h100", "h200", "gh200", "b100", "b200", "gb200", "l4", "l40",
                "l40s", "t4", "p100", "mi250", "mi300x")
_FAMILY = re.compile(r"\b(" + "|".join(sorted(GPU_FAMILIES, key=len, reverse=True)) + r")\b")


def families(name: str | None) -> tuple[str, ...]:
    """The GPU families a device name names (lower case): `NVIDIA H100 80GB HBM3` -> ("h100",)."""
    return tuple(dict.fromkeys(_FAMILY.findall((name or "").lower())))


@dataclass(frozen=True)
class Device:
    """What compute times were measured on (or estimated for): cpu or gpu, a label, its GPU families."""

    kind: str
    label: str
    families: tuple[str, ...] = ()


def compute_device(profile: Profile) -> Device:
    """The device a profile's (or a trace's) compute times are of."""
    if profile.scaled_to:
        return Device("gpu", str(profile.scaled_to.get("device", profile.scaled_to.get("gpu"))),
                      families(profile.scaled_to.get("gpu")))
    if profile.config.get("device") == "cuda":
        return Device("gpu", profile.hardware or "an unnamed GPU", families(profile.hardware))
    return Device("cpu", f"this CPU ({profile.hardware})" if profile.hardware else "a CPU")


def _what(profile: Profile) -> str:
    return "trace" if profile.config.get("source") == "trace" else "profile"


def device_warnings(profile: Profile, comm: CommModel, cluster: str | None, fit_device: str,
                    compute_s: float | None) -> list[str]:
    """Warnings where the compute times are not of the device the network is: a CPU profile or trace for
    a GPU cluster, one of another GPU than the cluster's (a profile scaled to a V100 for an H100 preset),
    a GPU profile with this machine's CPU all-reduce fit, or the reverse. None with --compute-s."""
    return mismatch_warnings(compute_device(profile), _what(profile), comm, cluster, fit_device, compute_s)


def mismatch_warnings(device: Device, what: str, comm: CommModel, cluster: str | None, fit_device: str,
                      compute_s: float | None) -> list[str]:
    """`device_warnings` for compute times of `device` from a `what` (profile, trace) not yet measured."""
    if compute_s is not None:
        return []
    remedy = (f"or a {what} made on it" if what == "trace" else
              "or a profile measured on it (`ddpbench profile --device cuda` there)")
    if cluster is not None:
        gpus = "/".join(g.upper() for g in comm.gpus) or "GPUs"
        estimate = [g for g in comm.gpus if g in ("v100", "a100", "h100")]
        if estimate and what == "profile":
            remedy += f", or a FLOPs estimate for it (`ddpbench scale-profile --gpu {estimate[0]}`)"
        if device.kind == "cpu":
            return [f"a CPU {what} used for the GPU cluster --cluster={cluster} ({gpus}): the compute times are "
                    f"{device.label}'s, far longer than a GPU's, so communication looks cheap; pass --compute-s with "
                    f"the {gpus}'s compute seconds per iteration, {remedy}"]
        if comm.gpus and not set(device.families) & set(comm.gpus):
            return [f"the {what} is of {device.label}, the cluster --cluster={cluster} has {gpus}: the compute times "
                    f"are not the cluster's GPU's; pass --compute-s with the {gpus}'s compute seconds per iteration, "
                    f"{remedy}"]
        return []
    if device.kind == "gpu" and fit_device == "cpu":
        return [f"a {what} of {device.label} predicted with this machine's CPU all-reduce fit (--device cpu): pass "
                "--device cuda --backend nccl for a GPU fit, or --cluster"]
    if device.kind == "cpu" and fit_device == "cuda":
        return [f"a CPU {what} ({device.label}) predicted with this machine's GPU all-reduce fit (--device cuda): "
                "the compute times are far longer than the GPU's; pass --compute-s, or a profile measured on the GPU"]
    return []
