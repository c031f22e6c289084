"""Observation path: ROS messages in, the bytes of an infer frame out, against the memcpy floor.

Run: ``python bench/bench_observation.py [--quick] [--repeat R] [--json PATH]``.

One step of n envs, each with two cameras and a 14-joint JointState, goes
through the code the bridge runs, in four stages timed separately:

* take: rclpy turns each message's CDR bytes into a Python message (what the
  executor does for every message a subscription takes; for a ``raw=True``
  subscription, the two copies of rclpy's serialized take: the rmw's copy of
  the sample into a fresh buffer, then that buffer into a Python ``bytes``)
  and the bridge's subscription callback stores it
  (and, where the bridge does so, hands an image's conversion to its
  converter thread);
* convert: the wait, after the last message, for the converter thread to
  finish (in the bridge this overlaps whatever the executor does next; 0
  where conversion happens at capture);
* capture: :meth:`EnvIO.observe` of every env (freshness, conversion of each
  message to numpy or collecting the converter's result, shape checks);
* encode: the rollout's infer for the n rows, encoded (:meth:`Outgoing.encode`:
  msgpack, one buffer);
* frame: websockets turns the message into one masked client frame (the
  protocol allows one message per frame, no fragments), the bytes handed to
  the socket.

``--clock cpu`` times every stage and the floor in the process's CPU time
instead of wall time: on a machine shared with other work, time spent
descheduled then counts nowhere (the converter thread's JPEG decoding still
counts; DDS's own threads add a little).

``--compare`` also runs, interleaved in the same rounds, the bridge with
earlier choices put back: ``typed take`` (image subscriptions take typed
messages: rclpy's three copies of the pixels).

The floor is one memcpy of the infer's payload (the observation bytes it
carries) into a preallocated buffer, measured in the same loop: no bridge can
turn messages into those bytes with fewer than one copy. For JPEG cameras
the payload is the decoded pixels, and the decoder is compared with Pillow's.
"""

from __future__ import annotations

import argparse
import inspect
import io
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import numpy as np

IMAGE_CASES = ("none", "raw224", "raw640", "jpeg640")
ENV_COUNTS = (1, 4, 16)
CAMERAS = ("cam0", "cam1")
JOINTS = tuple(f"joint{i}" for i in range(14))
TARGET_FLOOR_RATIO = 3.0
BRIDGE = "bridge"
# variant -> the earlier choices it puts back
VARIANTS = {
    BRIDGE: frozenset(),
    "typed take": frozenset({"typed take"}),
}


def bridge_params(image_case: str, n: int) -> dict[str, Any]:
    """A bridge configuration (flat, dotted keys) with n envs robot0..: two cameras, 14 joints, 14 actions."""
    params: dict[str, Any] = {
        "envs": [f"robot{i}" for i in range(n)],
        "control.mode": "timer",
        "control.rate_hz": 100.0,
        "observations.states.joints.topic": "joint_states",
        "observations.states.joints.type": "sensor_msgs/JointState",
        "observations.states.joints.joints": list(JOINTS),
        "actions.arm.topic": "arm_cmd",
        "actions.arm.type": "sensor_msgs/JointState",
        "actions.arm.joints": list(JOINTS),
        "actions.arm.idle": "zero",
        "status.log_period_s": 0.0,
    }
    if image_case != "none":
        msg_type = "sensor_msgs/CompressedImage" if image_case.startswith("jpeg") else "sensor_msgs/Image"
        for cam in CAMERAS:
            suffix = "/compressed" if image_case.startswith("jpeg") else ""
            params[f"observations.images.{cam}.topic"] = f"{cam}/image{suffix}"
            params[f"observations.images.{cam}.type"] = msg_type
    return params


def test_picture(height: int, width: int, seed: int) -> np.ndarray:
    """A camera-like RGB picture: smooth gradients, shapes and sensor noise (pure noise would not compress
    like a camera frame, and a flat one would compress too well)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.stack([x / width * 200, y / height * 200, (x + y) / (width + height) * 255], axis=-1)
    for _ in range(12):
        cy, cx, r = rng.integers(0, height), rng.integers(0, width), rng.integers(10, height // 3)
        mask = (y - cy) ** 2 + (x - cx) ** 2 < r * r
        img[mask] = rng.integers(0, 256, size=3)
    img += rng.normal(0, 6, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def image_message(image_case: str, seed: int) -> Any:
    import cv2
    from sensor_msgs.msg import CompressedImage, Image

    height, width = (224, 224) if image_case == "raw224" else (480, 640)
    picture = test_picture(height, width, seed)
    if image_case.startswith("jpeg"):
        ok, encoded = cv2.imencode(".jpg", cv2.cvtColor(picture, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])
        assert ok
        msg = CompressedImage(format="jpeg")
        msg.data = encoded.tobytes()
        return msg
    msg = Image(height=height, width=width, encoding="rgb8", step=width * 3)
    msg.data = picture.tobytes()
    return msg


def joint_message(seed: int) -> Any:
    from sensor_msgs.msg import JointState

    rng = np.random.default_rng(seed)
    msg = JointState(name=list(JOINTS))
    msg.position = rng.standard_normal(len(JOINTS)).tolist()
    msg.velocity = rng.standard_normal(len(JOINTS)).tolist()
    return msg


class Pipeline:
    """n real :class:`EnvIO` objects on an unspun node, fed CDR bytes through their subscription callbacks."""

    def __init__(self, node: Any, image_case: str, n: int, variant: str, pool: Any) -> None:
        from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
        from rclpy.serialization import serialize_message
        from sensor_msgs.msg import JointState

        from plugrl_ros.protocol.codec import packb
        from plugrl_ros.robot.env_io import EnvIO, ShapeGuard
        from plugrl_ros.ros.config import load_config

        self.image_case = image_case
        self.n = n
        typed_take = "typed take" in VARIANTS[variant]
        params = bridge_params(image_case, n)
        # freshness is not measured here: a stall of the shared machine between take and capture must not fail
        params.update(
            {
                k[: -len("topic")] + "max_age_s": 0.0
                for k in list(params)
                if k.startswith("observations.") and k.endswith(".topic")
            }
        )
        config = load_config(params)
        group = MutuallyExclusiveCallbackGroup()
        before = set(node.subscriptions)
        # as the bridge builds them (a version whose EnvIO takes no converter pool converts at capture)
        extra = (pool,) if "converter_pool" in inspect.signature(EnvIO).parameters else ()
        self.pool = pool if extra and image_case.startswith("jpeg") else None  # only decoding is handed over
        self.ios = [
            EnvIO(node, i, ns, config, ShapeGuard(), group, lambda env: None, time.monotonic, *extra)
            for i, ns in enumerate(config.envs)
        ]
        callbacks = {s.topic_name: s for s in node.subscriptions if s not in before}
        # each robot's driver: the bridge observes only while its actuators have a subscriber
        self.drivers = [
            node.create_subscription(JointState, f"/robot{i}/arm_cmd", lambda msg: None, 10) for i in range(n)
        ]
        deadline = time.monotonic() + 10.0
        while any(getattr(io_, "unheard_actuators", list)() for io_ in self.ios) and time.monotonic() < deadline:
            time.sleep(0.01)
        # (cdr bytes, message type or None for a raw subscription, callback) for every message of one step
        self.deliveries: list[tuple[Any, type | None, Callable[[Any], None]]] = []
        for i in range(n):
            messages = [(f"/robot{i}/joint_states", joint_message(i))]
            if image_case != "none":
                suffix = "/compressed" if image_case.startswith("jpeg") else ""
                messages += [
                    (f"/robot{i}/{cam}/image{suffix}", image_message(image_case, 10 * i + k))
                    for k, cam in enumerate(CAMERAS)
                ]
            for topic, msg in messages:
                subscription = callbacks[topic]
                if getattr(subscription, "raw", False) and not typed_take:
                    self.deliveries.append((serialize_message(msg), None, subscription.callback))
                else:
                    self.deliveries.append((serialize_message(msg), type(msg), subscription.callback))
        self._metadata = packb({"message_type": "metadata", "data": {"protocol_version": 1}})
        self._steps = [0] * n

    def take(self) -> None:
        from rclpy.serialization import deserialize_message

        for cdr, msg_type, callback in self.deliveries:
            # rclpy's serialized take: rcl_take_serialized_message into a new buffer, then py::bytes of it
            callback(bytes(bytearray(cdr)) if msg_type is None else deserialize_message(cdr, msg_type))

    def converted(self) -> None:
        """Wait for the converter thread (one worker: what was queued before this is done)."""
        if self.pool is not None:
            self.pool.submit(int).result()

    def capture(self) -> list[Any]:
        now_ns = time.time_ns()
        rows = []
        for io_ in self.ios:
            row = io_.observe(now_ns)
            assert row is not None, io_.problem
            io_.begin_window()
            rows.append(row)
        return rows

    def connection(self) -> Any:
        """A connection that has read the trainer's metadata: its next message is an infer."""
        from plugrl_ros.protocol.connection import Connection

        connection = Connection(use_reuse=False)
        connection.receive(self._metadata)
        return connection

    def infer(self, connection: Any, rows: list[Any]) -> Any:
        return connection.infer(list(range(self.n)), self._steps, rows)


class Framer:
    """What websockets' client does to a binary message before the transport gets it (masking, header)."""

    def __init__(self) -> None:
        from websockets.client import ClientProtocol
        from websockets.protocol import State
        from websockets.uri import parse_uri

        self._protocol = ClientProtocol(parse_uri("ws://127.0.0.1:8000"), state=State.OPEN, max_size=None)

    def frame(self, data: bytes) -> list[bytes]:
        """The bytes websockets hands the socket for one message: one frame."""
        self._protocol.send_binary(data)
        return self._protocol.data_to_send()


def payload_bytes(obj: Any) -> int:
    if isinstance(obj, np.ndarray) or hasattr(obj, "nbytes"):  # an array, or rows the codec stacks
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    return 0


STAGES = ("take", "convert", "capture", "encode", "frame")


def measure(
    cases: list[tuple[str, int, str]], node: Any, repeat: int, clock: Callable[[], float] = time.perf_counter
) -> list[dict[str, Any]]:
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=1)
    pipelines = {case: Pipeline(node, *case, pool) for case in cases}
    framer = Framer()
    samples: dict[tuple[str, int, str], dict[str, list[float]]] = {
        case: {k: [] for k in (*STAGES, "total", "floor")} for case in cases
    }
    info: dict[tuple[str, int, str], dict[str, int]] = {}
    floors: dict[tuple[str, int, str], tuple[np.ndarray, np.ndarray]] = {}
    # Every round runs every case once (interleaved), several times, so that
    # load from a neighbour hits all cases alike; medians are reported.
    for round_index in range(repeat + 1):
        for case, pipe in pipelines.items():
            for _ in range(3):
                connection = pipe.connection()
                t0 = clock()
                pipe.take()
                t1a = clock()
                pipe.converted()
                t1 = clock()
                rows = pipe.capture()
                t2 = clock()
                outgoing = pipe.infer(connection, rows)
                data = outgoing.encode()
                t3 = clock()
                frames = framer.frame(data)
                t4 = clock()
                if case not in info:
                    payload = payload_bytes(outgoing.message()["data"])
                    info[case] = {"payload": payload, "frame": sum(len(f) for f in frames)}
                    src = np.frombuffer(np.random.default_rng(0).bytes(max(payload, 1)), dtype=np.uint8)
                    floors[case] = (src, np.empty_like(src))
                src, dst = floors[case]
                t5 = clock()
                np.copyto(dst, src)
                t6 = clock()
                del data, frames, outgoing, rows
                if round_index == 0:
                    continue  # warm-up round
                s = samples[case]
                for stage, seconds in zip(STAGES, (t1a - t0, t1 - t1a, t2 - t1, t3 - t2, t4 - t3)):
                    s[stage].append(seconds)
                s["total"].append(t4 - t0)
                s["floor"].append(t6 - t5)
    pool.shutdown()
    results = []
    for case in cases:
        s = {k: common.median(v) for k, v in samples[case].items()}
        # each sample's total over the floor measured right after it: the spread of the ratio
        ratios = [t / f for t, f in zip(samples[case]["total"], samples[case]["floor"])]
        spread = {
            q: common.percentile(ratios, f) for q, f in (("ratio_p25", 0.25), ("ratio_p50", 0.5), ("ratio_p75", 0.75))
        }
        image_case, n, variant = case
        results.append({"image": image_case, "n": n, "variant": variant, **info[case], **s, **spread})
    return results


def jpeg_decoders(repeat: int) -> dict[str, float]:
    """Seconds per 640x480 JPEG: the bridge's CompressedImage source, OpenCV alone, and Pillow."""
    import cv2
    from PIL import Image as PILImage

    from plugrl_ros.params.section import Section
    from plugrl_ros.ros.images import CompressedImageSource

    msg = image_message("jpeg640", 7)
    data = bytes(msg.data)
    array = np.frombuffer(data, dtype=np.uint8)
    source = CompressedImageSource(Section({}, "observations.images.cam0"))
    ours = source.convert(msg)
    pillow = np.asarray(PILImage.open(io.BytesIO(data)).convert("RGB"))
    assert ours.shape == pillow.shape == (480, 640, 3), (ours.shape, pillow.shape)
    # Same decoder family (libjpeg-turbo in both): the pictures must agree closely.
    assert np.abs(ours.astype(int) - pillow.astype(int)).mean() < 2.0
    cases = {
        "bridge": lambda: source.convert(msg),
        "pillow": lambda: np.asarray(PILImage.open(io.BytesIO(data)).convert("RGB")),
        "opencv_bgr": lambda: cv2.imdecode(array, cv2.IMREAD_COLOR),
    }
    result = common.interleaved_medians(cases, repeat, 0.02)
    return {**result, "jpeg_bytes": float(len(data))}


def scaling_fit(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Least squares ``cost = a + b * MB + c * n`` over the raw-image and no-image cases."""
    used = [r for r in rows if not r["image"].startswith("jpeg") and r["variant"] == BRIDGE]
    if len({r["n"] for r in used}) < 2 or len({r["payload"] for r in used}) < 3:
        return {}
    design = np.array([[1.0, r["payload"] / 1e6, r["n"]] for r in used])
    target = np.array([r[key] for r in used])
    (a, b, c), *_ = np.linalg.lstsq(design, target, rcond=None)
    return {"const_us": a * 1e6, "us_per_mb": b * 1e6, "us_per_env": c * 1e6}


def comparison_table(rows: list[dict[str, Any]]) -> str:
    """total/floor of the bridge and of each earlier variant run beside it, and the bridge's speed-up."""
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in rows)]
    by_case = {(r["image"], r["n"], r["variant"]): r for r in rows}
    head = ("case", "n", *(f"{v}: total/floor (p25-p75)" for v in variants), *(f"{v}/bridge" for v in variants[1:]))
    body = []
    for image, n, variant in by_case:
        if variant != BRIDGE or image == "none":
            continue
        cells = [image, n]
        for v in variants:
            r = by_case[(image, n, v)]
            cells.append(f"{r['ratio_p50']:.2f} ({r['ratio_p25']:.2f}-{r['ratio_p75']:.2f})")
        bridge = by_case[(image, n, BRIDGE)]["total"]
        cells += [f"{by_case[(image, n, v)]['total'] / bridge:.2f}" for v in variants[1:]]
        body.append(tuple(cells))
    return common.md_table(head, body)


def tables(results: dict[str, Any]) -> str:
    rows = [r for r in results["rows"] if r["variant"] == BRIDGE]
    head = (
        "case",
        "n",
        "payload MB",
        "floor µs",
        "take µs",
        "convert µs",
        "capture µs",
        "encode µs",
        "frame µs",
        "total µs",
        "total/floor",
        "convert+capture+encode /floor",
        "executor thread µs",
        "per env µs",
    )
    body = []
    for r in rows:
        floor = r["floor"]
        body.append(
            (
                r["image"],
                r["n"],
                f"{r['payload'] / 1e6:.2f}",
                common.fmt_us(floor),
                common.fmt_us(r["take"]),
                common.fmt_us(r.get("convert", 0.0)),
                common.fmt_us(r["capture"]),
                common.fmt_us(r["encode"]),
                common.fmt_us(r["frame"]),
                common.fmt_us(r["total"]),
                common.fmt_ratio(r["total"] / floor) if r["image"] != "none" else "-",
                common.fmt_ratio((r.get("convert", 0.0) + r["capture"] + r["encode"]) / floor)
                if r["image"] != "none"
                else "-",
                common.fmt_us(r["take"] + r["capture"]),
                common.fmt_us(r["total"] / r["n"]),
            )
        )
    clock = "process CPU time" if results.get("clock") == "cpu" else "wall time"
    out = [f"### Observation path (per step of n envs: 2 cameras + 14-joint JointState each; {clock})", ""]
    out.append(common.md_table(head, body))
    if any(r["variant"] != BRIDGE for r in results["rows"]):
        out += ["", "The bridge against its earlier choices, interleaved in the same run:", ""]
        out.append(comparison_table(results["rows"]))
    jpeg = results.get("jpeg")
    if jpeg:
        out += [
            "",
            f"JPEG 640x480 ({jpeg['jpeg_bytes'] / 1e3:.0f} kB) decode, µs per image: bridge source "
            f"{common.fmt_us(jpeg['bridge'])}, Pillow {common.fmt_us(jpeg['pillow'])}, "
            f"OpenCV imdecode alone (BGR) {common.fmt_us(jpeg['opencv_bgr'])}; "
            f"bridge/Pillow = {jpeg['bridge'] / jpeg['pillow']:.2f}",
        ]
    for key, label in (("total", "total"), ("floor", "floor")):
        fit = results.get(f"fit_{key}")
        if fit:
            out.append(
                f"\nScaling fit ({label}, raw and no-image cases): {fit['const_us']:,.0f} µs + "
                f"{fit['us_per_mb']:,.0f} µs/MB + {fit['us_per_env']:,.1f} µs/env"
            )
    return "\n".join(out)


def verdict(results: dict[str, Any]) -> list[str]:
    lines = []
    raw = [r for r in results["rows"] if r["image"].startswith("raw") and r["variant"] == BRIDGE]
    worst = max(raw, key=lambda r: r["total"] / r["floor"], default=None)
    if worst is not None:
        ratio = worst["total"] / worst["floor"]
        lines.append(
            f"raw images within {TARGET_FLOOR_RATIO:g}x the floor: "
            f"{'met' if ratio <= TARGET_FLOOR_RATIO else 'missed'} (worst {ratio:.2f}, {worst['image']} n={worst['n']})"
        )
    jpeg = results.get("jpeg")
    if jpeg:
        ratio = jpeg["bridge"] / jpeg["pillow"]
        lines.append(f"JPEG decoding at least as fast as Pillow: {'met' if ratio <= 1.0 else 'missed'} ({ratio:.2f})")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.standard_arguments(parser, repeat=9)
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also run the variants with earlier choices put back (typed take)",
    )
    parser.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall", help="time stages in wall time or process CPU time"
    )
    args = parser.parse_args()
    common.use_own_domain()
    common.tune_like_the_bridge()
    import rclpy
    from rclpy.node import Node

    rclpy.init()
    node = Node("plugrl_bench_observation")
    try:
        if args.quick:
            cases = [(image, 1, BRIDGE) for image in IMAGE_CASES]
            repeat = 1
        else:
            cases = [(image, n, BRIDGE) for image in IMAGE_CASES for n in ENV_COUNTS]
            repeat = args.repeat
        if args.compare:
            cases += [(image, n, v) for image, n, _ in cases if image != "none" for v in VARIANTS if v != BRIDGE]
        rows = measure(cases, node, repeat, time.process_time if args.clock == "cpu" else time.perf_counter)
        results: dict[str, Any] = {"clock": args.clock, "rows": rows, "jpeg": jpeg_decoders(3 if args.quick else 15)}
        results["fit_total"] = scaling_fit(rows, "total")
        results["fit_floor"] = scaling_fit(rows, "floor")
        results["verdict"] = verdict(results)
        print(tables(results))
        print()
        print("targets: " + "; ".join(results["verdict"]))
        common.save_json(args.json, "observation", results)
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
