"""OpenCV is optional: a plain ``pip install`` of the package brings none, and only images need it.

The bridge without image sources, the probe, the trainers and every other tool
run without it; what needs it says so at startup, with :data:`INSTALL`.
"""

from __future__ import annotations

INSTALL = (
    "install OpenCV: pip install 'plugrl_ros[opencv]' (or opencv-python-headless), "
    "or on a ROS 2 install rosdep's python3-opencv (sudo apt install python3-opencv)"
)


def missing() -> str | None:
    """Why OpenCV cannot be imported (the ImportError's text), or None if it can."""
    try:
        import cv2  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None
