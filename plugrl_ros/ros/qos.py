"""The QoS profiles a config may name, and a readable error for incompatible publishers."""

from __future__ import annotations

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy


def qos_profile(name: str, depth: int) -> QoSProfile:
    """``sensor_data`` / ``best_effort`` subscribe compatibly with best-effort and reliable publishers alike."""
    reliability = ReliabilityPolicy.RELIABLE if name == "reliable" else ReliabilityPolicy.BEST_EFFORT
    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=depth,
        reliability=reliability,
        durability=DurabilityPolicy.VOLATILE,
    )


def subscription_event_callbacks(on_incompatible):
    """Event callbacks reporting an incompatible-QoS publisher (Humble: rclpy.qos_event; later: event_handler)."""
    try:
        from rclpy.event_handler import SubscriptionEventCallbacks
    except ImportError:  # Humble
        from rclpy.qos_event import SubscriptionEventCallbacks
    return SubscriptionEventCallbacks(incompatible_qos=on_incompatible)
