"""Device health as the kubelet's DRA health service wants it, shared by publisher and plugin.

The publisher (:mod:`gpupool.kube.publisher`) writes each device's verdict after every sample;
the gRPC health service (:mod:`gpupool.kube.grpcapi`) streams the board to the kubelet, once
at the start and again at each change, which the kubelet shows in the pod's status
(``allocatedResourcesStatus``). A lost GPU is ``UNHEALTHY`` here as well as withdrawn from the
slice: pods already holding it learn it this way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceState:
    """One device's health: ``healthy`` ``None`` = unknown; ``since`` Unix seconds."""

    device: str
    healthy: bool | None
    message: str
    since: int


class HealthBoard:
    """The current health of a node's devices, with a version that grows at each change."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._states: dict[str, DeviceState] = {}
        self.version = 0

    def update(self, verdicts: Mapping[str, tuple[bool, str]]) -> None:
        """``device name -> (healthy, message)``; unchanged entries keep their ``since``."""
        with self._cond:
            changed = False
            for device, (healthy, message) in verdicts.items():
                old = self._states.get(device)
                if old is None or old.healthy != healthy or old.message != message:
                    self._states[device] = DeviceState(device, healthy, message, int(time.time()))
                    changed = True
            if changed:
                self.version += 1
                self._cond.notify_all()

    def snapshot(self) -> tuple[int, tuple[DeviceState, ...]]:
        with self._cond:
            return self.version, tuple(self._states[k] for k in sorted(self._states))

    def wait_change(self, seen: int, timeout_s: float, stop: threading.Event) -> bool:
        """Waits until the version passes ``seen``; ``False`` on timeout or once ``stop`` is
        set (and :meth:`wake` called)."""
        with self._cond:
            self._cond.wait_for(lambda: self.version != seen or stop.is_set(), timeout=timeout_s)
            return self.version != seen and not stop.is_set()

    def wake(self) -> None:
        """Wakes every waiter to look at its stop event (the plugin is stopping)."""
        with self._cond:
            self._cond.notify_all()
