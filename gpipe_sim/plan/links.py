"""Which link a transfer or an all-reduce ring uses: a directed device pair in a node, or a network port.

Keys are integers, one per link of the cluster of `n_dev` devices: a*n_dev + b for the directed
pair a -> b inside a node, n_dev*n_dev + port for a network port (`Hardware.network_ports`).
"""

from __future__ import annotations

import numpy as np

from gpipe_sim.hardware.hardware import Hardware
from gpipe_sim.kept import Kept
from gpipe_sim.mesh import node_of


def transfer_link_keys(hardware: Hardware, a: np.ndarray, b: np.ndarray, n_dev: int, per_node: int) -> np.ndarray:
    """The link of each point-to-point send from device a[i] to device b[i] (a[i] != b[i]): the
    pair's link inside a node, else the sender's network port."""
    between = node_of(a, per_node) != node_of(b, per_node)
    return np.where(between, n_dev * n_dev + hardware.network_ports(a, per_node), a * n_dev + b)


_RINGS: Kept[tuple[int, ...]] = Kept(4096)  # the last rings' keys, by what `ring_link_keys` reads


def ring_link_keys(hardware: Hardware, ring: list[int], n_dev: int, per_node: int) -> list[int]:
    """The links a ring all-reduce over the devices `ring` (in ring order) holds: each hop's pair
    link inside a node; a hop leaving the node, the sender's port, or every NIC of its node
    (`Hardware.ring_ports`, which reads the hardware's `network` alone). A key may repeat. Kept
    for the next call with the same network and ring (the planner compiles thousands of
    candidates over a few rings)."""
    key = (hardware.network, tuple(ring), n_dev, per_node)
    return list(_RINGS.get(key, lambda: tuple(_ring_keys(hardware, ring, n_dev, per_node))))


def _ring_keys(hardware: Hardware, ring: list[int], n_dev: int, per_node: int) -> list[int]:
    """`ring_link_keys`, made."""
    keys: list[int] = []
    for a, b in zip(ring, ring[1:] + ring[:1]):
        if a != b and node_of(a, per_node) == node_of(b, per_node):
            keys.append(a * n_dev + b)
        elif a != b:
            keys.extend(n_dev * n_dev + port for port in hardware.ring_ports(a, per_node))
    return keys
