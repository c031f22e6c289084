"""The bridge's ROS parameters: every key's type, default, range and meaning, in one table.

This table is the one source of defaults: :class:`plugrl_ros.params.section.Section`
falls back to it for a key the params file leaves out, checks its ranges and
choices, and the node declares every key it read with a descriptor built from
it, so ``ros2 param list/describe/get`` show the configuration the bridge runs
with. Every parameter is read-only: the bridge is configured once, at startup
(its topics, timers and trainer link are built from these values), so
``ros2 param set`` is refused rather than accepted and ignored.

``<name>`` and ``<part>`` in a key stand for names the user chooses (an image,
a state, a part of a state, an action sink).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from plugrl_ros.policy.execution import MODES as POLICY_EXECUTION_MODES
from plugrl_ros.protocol.policy.session import DEFAULT_ACTION_KEY

QOS_CHOICES = ("sensor_data", "best_effort", "reliable")
BRIDGE_MODES = ("train", "deploy", "teleop")
POLICY_KEY_SEPARATORS = ("/", ".", "")
TAKEOVER_RULES = ("button", "topic", "fresh")  # plugrl_ros.robot.takeover


class _NoValue:
    """A default that is not a value: the key is required, optional, or its default depends on the type."""

    def __init__(self, shown: str) -> None:
        self.shown = shown

    def __repr__(self) -> str:
        return self.shown


REQUIRED: Any = _NoValue("required")
NONE: Any = _NoValue("none")  # optional: left out, the feature is off
PER_TYPE: Any = _NoValue("per type")  # the message type's class supplies it (or requires it)

# "value": any scalar or list, its type checked against a message field (an actuator's defaults)
KINDS = ("bool", "int", "float", "str", "int list", "str list", "float or float list", "value")


@dataclass(frozen=True)
class Spec:
    """One parameter: its dotted key, type, default and allowed values."""

    key: str
    kind: str
    default: Any
    description: str
    minimum: float | None = None
    maximum: float | None = None
    positive: bool = False  # greater than 0 (ROS ranges are closed: declared as from 0)
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind

    @property
    def has_default(self) -> bool:
        return not isinstance(self.default, _NoValue)

    def allowed(self) -> str:
        """The constraint in words, for ``ros2 param describe``."""
        parts = []
        if self.choices:
            parts.append("one of: " + ", ".join(self.choices))
        if self.positive:
            parts.append("greater than 0")
        elif self.minimum is not None:
            parts.append(f"at least {self.minimum:g}")
        if self.maximum is not None:
            parts.append(f"at most {self.maximum:g}")
        return "; ".join(parts)


def _subscription(prefix: str, qos: str, max_age_s: float) -> list[Spec]:
    return [
        Spec(f"{prefix}.topic", "str", REQUIRED, "topic to subscribe to (relative names resolve in each env)"),
        Spec(f"{prefix}.type", "str", REQUIRED, "message type, pkg/Type or pkg/msg/Type"),
        Spec(f"{prefix}.qos", "str", qos, "subscription QoS", choices=QOS_CHOICES),
        Spec(f"{prefix}.max_age_s", "float", max_age_s, "older than this is stale (0 = no limit)", minimum=0.0),
        Spec(f"{prefix}.sync", "bool", False, "the topic publishes once per action step: a step waits for it"),
    ]


def _state(prefix: str) -> list[Spec]:
    return [
        *_subscription(prefix, "sensor_data", 1.0),
        Spec(f"{prefix}.joints", "str list", PER_TYPE, "JointState: joints, selected and ordered by name"),
        Spec(f"{prefix}.fields", "str list", PER_TYPE, "JointState: position/velocity/effort; others: field paths"),
        Spec(f"{prefix}.slice", "int list", NONE, "[start, stop) of a multi-array"),
        Spec(
            f"{prefix}.beams",
            "int",
            PER_TYPE,
            "LaserScan (required): the ranges resampled to this many beams",
            positive=True,
        ),
        Spec(
            f"{prefix}.reduce",
            "str",
            "min",
            "LaserScan: each beam is the nearest return of its sector (min) or its first reading (step)",
            choices=("min", "step"),
        ),
        Spec(
            f"{prefix}.invalid_value",
            "float",
            NONE,
            "LaserScan: what NaN, inf and out-of-range readings become (left out: the message's range_max)",
        ),
        Spec(f"{prefix}.intensities", "bool", False, "LaserScan: the beams' intensities follow their ranges"),
    ]


_POLICY_SOURCE = "the source sent under this key: images.<name>, states.<name> or text"

_POLICY: tuple[Spec, ...] = (
    Spec("policy.uri", "str", REQUIRED, "policy server address, ws:// or wss://"),
    Spec("policy.api_key_env", "str", "", "name of the environment variable holding the API key (never the key)"),
    Spec("policy.ca_file", "str", "", 'CA bundle for a wss:// server ("" = system CAs)'),
    Spec("policy.reconnect_initial_s", "float", 0.5, "first reconnect delay (doubling, jittered)", positive=True),
    Spec("policy.reconnect_max_s", "float", 10.0, "longest reconnect delay", positive=True),
    Spec(
        "policy.open_timeout_s", "float", 10.0, "one connection attempt's timeout (and the metadata's)", positive=True
    ),
    Spec(
        "policy.tcp_timeout_s",
        "float",
        20.0,
        "TCP keepalive and TCP_USER_TIMEOUT: the kernel drops a server silent this long (0 = OS defaults)",
        minimum=0.0,
    ),
    Spec("policy.max_frame_mb", "float", 0.0, "refuse larger answers (0 = any size)", minimum=0.0),
    Spec("policy.observations.<name>", "str", REQUIRED, _POLICY_SOURCE),
    Spec("policy.observations.<name>.<part>", "str", REQUIRED, _POLICY_SOURCE),
    Spec("policy.observations.<name>.<part>.<leaf>", "str", REQUIRED, _POLICY_SOURCE),
    Spec(
        "policy.key_separator",
        "str",
        "/",
        'joins nested observation names into one request key ("" = send nested maps)',
        choices=POLICY_KEY_SEPARATORS,
    ),
    Spec("policy.action_key", "str", DEFAULT_ACTION_KEY, "the answer's key holding the actions [H, action_dim]"),
    Spec("policy.action_horizon", "int", 0, "expected H (0 = as announced, or the first answer's)", minimum=0),
    Spec("policy.action_dim", "int", 0, "expected action width (0 = as announced, or the first answer's)", minimum=0),
    Spec("policy.execution.mode", "str", "switch", "how a new chunk takes over", choices=POLICY_EXECUTION_MODES),
    Spec(
        "policy.execution.request_ahead_steps",
        "int",
        0,
        "request the next chunk with this many steps left (0 = from the measured latency)",
        minimum=0,
    ),
    Spec("policy.execution.ensemble_rate", "float", 0.01, "ensemble weights exp(-rate * i), i = 0 the oldest"),
    Spec("policy.execution.crossfade_steps", "int", 5, "ticks a crossfade takes", minimum=1),
    Spec("policy.latency.initial_s", "float", 0.1, "request latency assumed until one is measured", minimum=0.0),
    Spec(
        "policy.latency.max_s",
        "float",
        5.0,
        "after a connection's first answer, a request unanswered this long: the link is dead, reconnect",
        positive=True,
    ),
    Spec(
        "policy.latency.first_answer_s",
        "float",
        300.0,
        "a connection's first request unanswered this long: the link is dead (a model may be compiling)",
        positive=True,
    ),
)


_INTERVENTION: tuple[Spec, ...] = (
    Spec(
        "intervention.source",
        "str",
        REQUIRED,
        "the person's command: joy (sensor_msgs/Joy axes) or actions (each actuator's own message type)",
        choices=("joy", "actions"),
    ),
    Spec(
        "intervention.takeover",
        "str",
        "button",
        "the person commands while: a Joy button is held (button), a std_msgs/Bool says true (topic), "
        "or a command is fresher than max_age_s (fresh)",
        choices=TAKEOVER_RULES,
    ),
    Spec(
        "intervention.max_age_s",
        "float",
        0.5,
        "a command (or deadman) older than this is silent: held, the robot idles; fresh rule, the policy commands",
        positive=True,
    ),
    Spec("intervention.qos", "str", "sensor_data", "QoS of the person's topics", choices=QOS_CHOICES),
    Spec("intervention.topic", "str", "", "takeover topic: the std_msgs/Bool deadman, true = the person holds"),
    Spec("intervention.joy.topic", "str", "joy", "the sensor_msgs/Joy topic (source joy, takeover button)"),
    Spec("intervention.joy.axes", "int list", NONE, "source joy: the axis of each action value, in order"),
    Spec("intervention.joy.scale", "float or float list", 1.0, "action value = axis * scale + offset"),
    Spec("intervention.joy.offset", "float or float list", 0.0, "action value = axis * scale + offset"),
    Spec("intervention.joy.button", "int", 4, "takeover button: the deadman's index in Joy.buttons", minimum=0),
    Spec(
        "intervention.actions.<name>",
        "str",
        REQUIRED,
        "source actions: the topic of actuator <name>'s command, in the actuator's own message type",
    ),
)


SPECS: tuple[Spec, ...] = (
    Spec(
        "mode",
        "str",
        "train",
        "train: a PlugRL trainer drives the robots; deploy: a policy server (the policy section); "
        "teleop: a person, through the intervention section",
        choices=BRIDGE_MODES,
    ),
    Spec("trainer.uri", "str", "ws://localhost:8000", "trainer address, ws:// or wss://"),
    Spec("trainer.api_key_env", "str", "", "name of the environment variable holding the API key (never the key)"),
    Spec("trainer.ca_file", "str", "", 'CA bundle for a wss:// trainer ("" = system CAs)'),
    Spec("trainer.wait_for_next_run", "bool", False, "after the trainer ends its run, wait for the next one"),
    Spec("trainer.reconnect_initial_s", "float", 0.5, "first reconnect delay (doubling, jittered)", positive=True),
    Spec("trainer.reconnect_max_s", "float", 10.0, "longest reconnect delay", positive=True),
    Spec("trainer.open_timeout_s", "float", 10.0, "one connection attempt's timeout", positive=True),
    Spec(
        "trainer.first_answer_timeout_s",
        "float",
        300.0,
        "the link is dead if a connection's metadata or first action takes longer (0 = no bound)",
        minimum=0.0,
    ),
    Spec(
        "trainer.answer_timeout_s",
        "float",
        30.0,
        "after that, the link is dead if an action takes longer than this after its infer (0 = no bound)",
        minimum=0.0,
    ),
    Spec(
        "trainer.tcp_timeout_s",
        "float",
        20.0,
        "TCP keepalive and TCP_USER_TIMEOUT: the kernel drops a peer silent this long (0 = OS defaults)",
        minimum=0.0,
    ),
    Spec("trainer.max_frame_mb", "float", 0.0, "refuse larger trainer frames (0 = any size)", minimum=0.0),
    Spec("trainer.use_reuse", "bool", True, "use the trainer's reuse-feedback-obs feature when offered"),
    Spec(
        "trainer.text_format", "str", "array", "text as a numpy <U array or a msgpack list", choices=("array", "list")
    ),
    Spec("envs", "str list", [""], 'one namespace per robot ([""]: one robot, no namespace)'),
    Spec("control.mode", "str", "timer", "timer (fixed rate) or lockstep (simulators)", choices=("timer", "lockstep")),
    Spec("control.rate_hz", "float", 20.0, "control rate (timer mode)", positive=True, maximum=2000.0),
    Spec("control.replan_steps", "int", 0, "run at most this many steps of each chunk (0 = all)", minimum=0),
    Spec("control.action_horizon", "int", 0, "expected H if the trainer does not announce it (0 = any)", minimum=0),
    Spec(
        "control.action_dim", "int", 0, "expected action width if the trainer does not announce it (0 = any)", minimum=0
    ),
    Spec("control.feedback_deadline_s", "float", 30.0, "never hold feedback longer", positive=True, maximum=55.0),
    Spec(
        "control.batch_window_s", "float", 0.02, "wait this long for envs finishing together", minimum=0.0, maximum=5.0
    ),
    Spec("control.env_timeout_s", "float", 5.0, "a step result this late fails the robot (0 = never)", minimum=0.0),
    Spec(
        "control.wait_for_subscribers",
        "bool",
        True,
        "start a chunk only while every actuator topic has a subscriber (commands nobody hears are lost)",
    ),
    *_subscription("observations.images.<name>", "sensor_data", 1.0),
    Spec("observations.images.<name>.resize", "int list", NONE, "[height, width]"),
    Spec("observations.images.<name>.crop", "int list", NONE, "[y, x, height, width], before resize"),
    Spec("observations.images.<name>.channels", "int", 3, "3 = RGB, 1 = gray", minimum=1, maximum=3),
    Spec("observations.images.<name>.depth_scale", "float", 1.0, "depth to uint8 scale (16UC1, 32FC1)", positive=True),
    *_state("observations.states.<name>"),
    Spec("observations.states.<name>.parts", "str list", NONE, "concatenate named sub-sources <name>.<part>.*"),
    *_state("observations.states.<name>.<part>"),
    Spec("observations.text.prompt", "str", "", "a fixed prompt"),
    Spec("observations.text.topic", "str", "", "or the latest std_msgs/String on a topic"),
    Spec("observations.text.qos", "str", "reliable", "subscription QoS", choices=QOS_CHOICES),
    Spec("observations.text.max_age_s", "float", 0.0, "older than this is stale (0 = no limit)", minimum=0.0),
    Spec("observations.text.sync", "bool", False, "the topic publishes once per action step: a step waits for it"),
    Spec("actions.<name>.topic", "str", REQUIRED, "topic to publish the commands on (an action type: its server)"),
    Spec(
        "actions.<name>.type", "str", REQUIRED, "message type, pkg/Type or pkg/msg/Type; or an action, pkg/action/Type"
    ),
    Spec("actions.<name>.qos", "str", "reliable", "publisher QoS", choices=QOS_CHOICES),
    Spec(
        "actions.<name>.slice",
        "int list",
        PER_TYPE,
        "[start, stop) of the action vector ([0, width] if left out; a multi-array without one: the whole action)",
    ),
    Spec("actions.<name>.joints", "str list", PER_TYPE, "JointState, JointTrajectory: joint names"),
    Spec(
        "actions.<name>.field", "str", PER_TYPE, "JointState: position/velocity/effort; JointTrajectory: positions/..."
    ),
    Spec(
        "actions.<name>.fields",
        "str list",
        PER_TYPE,
        "Twist, TwistStamped: linear.x ... angular.z, one per value; other types: field paths the action fills",
    ),
    Spec(
        "actions.<name>.defaults.<path>",
        "value",
        NONE,
        "other types: a field the action does not fill, and its value (nested like the message)",
    ),
    Spec("actions.<name>.frame_id", "str", "", "TwistStamped: the header's frame"),
    Spec("actions.<name>.scale", "float or float list", 1.0, "value * scale + offset (one number, or one per value)"),
    Spec("actions.<name>.offset", "float or float list", 0.0, "value * scale + offset (one number, or one per value)"),
    Spec("actions.<name>.min", "float or float list", NONE, "clip limit (one number, or one per value)"),
    Spec("actions.<name>.max", "float or float list", NONE, "clip limit (one number, or one per value)"),
    Spec("actions.<name>.max_delta", "float or float list", NONE, "largest change per step (one, or one per value)"),
    Spec("actions.<name>.idle", "str", "hold", "with no valid action", choices=("hold", "zero", "none")),
    Spec(
        "actions.<name>.running_goal",
        "str",
        "replace",
        "an action: a step that comes while the last goal runs replaces it (cancelled), or is skipped",
        choices=("replace", "skip"),
    ),
    Spec(
        "actions.<name>.goal_period_s",
        "float",
        0.0,
        "an action: at least this long between two goals; the steps in between send none (0 = every step)",
        minimum=0.0,
    ),
    Spec("reward.topic", "str", "", 'std_msgs/Float32 or Float64 reward ("" = every step earns 0)'),
    Spec("reward.type", "str", "std_msgs/Float32", "std_msgs/Float32 or std_msgs/Float64"),
    Spec("reward.mode", "str", "sum", "sum every message during a step, or the latest", choices=("sum", "latest")),
    Spec("reward.qos", "str", "reliable", "subscription QoS", choices=QOS_CHOICES),
    Spec("reward.max_age_s", "float", 0.0, "> 0: a reward topic silent this long makes the env stale", minimum=0.0),
    Spec("reward.sync", "bool", False, "one reward message per action step: a step waits for it"),
    Spec("episode.terminated_topic", "str", "", "std_msgs/Bool: true ends the episode (terminated)"),
    Spec("episode.truncated_topic", "str", "", "std_msgs/Bool: true ends the episode (truncated)"),
    Spec("episode.success_topic", "str", "", "std_msgs/Bool: true marks the episode a success"),
    Spec("episode.qos", "str", "reliable", "subscription QoS", choices=QOS_CHOICES),
    Spec("episode.max_steps", "int", 0, "truncate after this many steps (0 = no limit)", minimum=0),
    Spec("episode.sync", "bool", False, "terminated/truncated publish once per action step: a step waits"),
    Spec("reset.mode", "str", "none", "how an episode restarts", choices=("none", "service", "signal")),
    Spec("reset.service", "str", "reset", "the reset service, under each env's namespace"),
    Spec(
        "reset.service_type", "str", "std_srvs/Trigger", "any service type, pkg/srv/Type (std_srvs/Trigger, Empty, ...)"
    ),
    Spec("reset.request.<path>", "value", NONE, "a field of the reset request and its value (nested like the request)"),
    Spec(
        "reset.success_field",
        "str",
        "success",
        "the response's field that says the reset worked (false or 0: failed, retried); used if the response has it",
    ),
    Spec("reset.message_field", "str", "message", "the response's field that says why (logged on a failure)"),
    Spec("reset.timeout_s", "float", 10.0, "a reset call taking longer fails", positive=True),
    Spec("reset.retry_initial_s", "float", 1.0, "first retry delay of a failed reset (doubling)", positive=True),
    Spec("reset.retry_max_s", "float", 30.0, "longest retry delay of a failed reset", positive=True),
    Spec("reset.ready_topic", "str", "ready", "signal mode: std_msgs/Bool true = ready"),
    Spec(
        "reset.on_start",
        "bool",
        True,
        "every env starts a fresh episode at startup and after every reconnect (reset first, unless mode is none)",
    ),
    Spec("pause.topic", "str", "", "std_msgs/Bool: true pauses"),
    Spec("pause.start_paused", "bool", False, "start paused (also the ~/set_paused service)"),
    Spec("pause.max_age_s", "float", 0.0, "> 0: dead-man switch, run only while false arrives this often", minimum=0.0),
    Spec("status.diagnostics_period_s", "float", 1.0, "/diagnostics period", positive=True),
    Spec("status.log_period_s", "float", 10.0, "one-line status log period (0 = off)", minimum=0.0),
    Spec("record.path", "str", "", 'folder to record every transition into, as MCAP ("" = off)'),
    Spec("record.max_file_mb", "float", 2048.0, "start a new file past this size (0 = no limit)", minimum=0.0),
    Spec(
        "record.max_file_duration_s",
        "float",
        600.0,
        "start a new file past this much time (0 = no limit)",
        minimum=0.0,
    ),
    Spec(
        "record.queue_mb",
        "float",
        256.0,
        "memory for records waiting to be written; past it they are dropped",
        positive=True,
    ),
    Spec("record.image_format", "str", "raw", "images as recorded", choices=("raw", "jpeg", "png")),
    Spec("record.jpeg_quality", "int", 90, "JPEG quality (image_format jpeg)", minimum=1, maximum=100),
    Spec("record.compression", "str", "lz4", "compression of the file's chunks", choices=("none", "lz4", "zstd")),
    Spec("record.flush_interval_s", "float", 1.0, "a killed bridge loses at most this much recording", positive=True),
    *_POLICY,
    *_INTERVENTION,
)


def _pattern(key: str) -> re.Pattern[str]:
    """A regex for a declared key: ``<name>`` and ``<part>`` match any one name, ``<path>`` one or more."""

    def part_pattern(part: str) -> str:
        if part == "<path>":
            return r"[^.]+(?:\.[^.]+)*"
        return "[^.]+" if part.startswith("<") else re.escape(part)

    return re.compile(r"\.".join(part_pattern(part) for part in key.split(".")))


_PATTERNS = [(_pattern(spec.key), spec) for spec in SPECS]


def find_spec(key: str, specs: tuple[Spec, ...]) -> Spec | None:
    """The declaration of a dotted key among ``specs`` (a table kept apart from :data:`SPECS`), or None."""
    return next((spec for spec in specs if _pattern(spec.key).fullmatch(key)), None)


def spec_for(key: str) -> Spec | None:
    """The declaration of a dotted key (``actions.arm.idle`` is ``actions.<name>.idle``), or None."""
    for pattern, spec in _PATTERNS:
        if pattern.fullmatch(key):
            return spec
    return None


def parameter_value(spec: Spec, value: Any) -> Any:
    """``value`` as the declared type holds it: a float key given ``50`` holds ``50.0``."""
    if spec.kind in ("float", "float or float list"):
        if isinstance(value, (list, tuple)):
            return [float(v) for v in value]
        return float(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def descriptor(spec: Spec, key: str, value: Any) -> Any:
    """The read-only ParameterDescriptor of ``key`` holding ``value``."""
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, ParameterType

    if spec.kind == "float or float list":
        kind = "float list" if isinstance(value, list) else "float"
    elif spec.kind == "value":
        kind = _value_kind(value)
    else:
        kind = spec.kind
    types = {
        "bool": ParameterType.PARAMETER_BOOL,
        "int": ParameterType.PARAMETER_INTEGER,
        "float": ParameterType.PARAMETER_DOUBLE,
        "str": ParameterType.PARAMETER_STRING,
        "int list": ParameterType.PARAMETER_INTEGER_ARRAY,
        "float list": ParameterType.PARAMETER_DOUBLE_ARRAY,
        "str list": ParameterType.PARAMETER_STRING_ARRAY,
        "bool list": ParameterType.PARAMETER_BOOL_ARRAY,
    }
    meaning = spec.description
    if spec.default is REQUIRED or spec.default is PER_TYPE:
        meaning += f" (default: {spec.default!r})"
    result = ParameterDescriptor(
        name=key,
        type=types[kind],
        description=meaning,
        additional_constraints=spec.allowed(),
        read_only=True,
    )
    low = 0.0 if spec.positive else spec.minimum
    if (low is not None or spec.maximum is not None) and kind in ("int", "float"):
        if kind == "int":
            high = int(spec.maximum) if spec.maximum is not None else 2**63 - 1
            result.integer_range = [IntegerRange(from_value=int(low if low is not None else -(2**63)), to_value=high)]
        else:
            high = spec.maximum if spec.maximum is not None else math.inf
            result.floating_point_range = [
                FloatingPointRange(from_value=float(low if low is not None else -math.inf), to_value=float(high))
            ]
    return result


def _value_kind(value: Any) -> str:
    """The declared type of a "value" key: what the params file gave (a list: its first element's type)."""
    first = value[0] if isinstance(value, list) and value else value
    names = {bool: "bool", int: "int", float: "float", str: "str"}
    kind = names.get(type(first), "str")
    if isinstance(value, list):
        return {"bool": "bool list", "int": "int list", "float": "float list", "str": "str list"}[kind]
    return kind


def declare(node: Any, values: Mapping[str, Any]) -> None:
    """Declare every key in ``values`` (the configuration as read) on ``node``, read-only, with these values."""
    for key, value in values.items():
        spec = spec_for(key)
        assert spec is not None, f"{key} was read but has no declaration"
        held = parameter_value(spec, value)
        node.declare_parameter(key, held, descriptor(spec, key, held), ignore_override=True)
