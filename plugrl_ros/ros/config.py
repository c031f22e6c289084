"""The bridge's configuration: ROS parameters parsed once, at startup, into frozen dataclasses.

Every key is read through :class:`plugrl_ros.params.section.Section`, so a
wrong type, an impossible value or an unknown key fails here, before
anything connects, with the key's full dotted name, the value given and what
is allowed. Everything after startup trusts these objects.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from plugrl_ros.params.policy import PolicyConfig, check_policy_environment, load_policy_config
from plugrl_ros.params.section import MISSING, ConfigError, Section, nest
from plugrl_ros.protocol.client import ClientSettings
from plugrl_ros.record.settings import RecordSettings, parse_record_section
from plugrl_ros.ros.field_paths import compile_path, interface_class, message_factory, string_reader
from plugrl_ros.ros.images import make_image_source
from plugrl_ros.ros.sinks import ActionShaper, make_sink
from plugrl_ros.ros.sources import TextSource, make_state_source, short_type_name

REWARD_TYPES = ("std_msgs/Float32", "std_msgs/Float64")

ROOT_KEYS = (
    "mode",
    "trainer",
    "envs",
    "control",
    "observations",
    "actions",
    "reward",
    "episode",
    "reset",
    "pause",
    "status",
    "record",
    "policy",
    "intervention",
)
# Parameters every ROS node has; they are not the bridge's to validate.
_ROS_OWNED_PREFIXES = ("use_sim_time", "qos_overrides.", "start_type_description_service", "start_parameter_services")


@dataclass(frozen=True)
class TopicConfig:
    """A subscription: where, what type, and how stale it may get."""

    key: str  # the dotted config key, for messages
    topic: str
    type_name: str
    qos: str
    max_age_s: float  # 0 = no limit
    converter: Any  # a StateSource / ImageSource / TextSource
    sync: bool = False  # publishes once per action step: a step's result waits for its message


@dataclass(frozen=True)
class StateConfig:
    name: str
    parts: tuple[TopicConfig, ...]  # concatenated in order


@dataclass(frozen=True)
class ImageConfig:
    name: str
    source: TopicConfig


@dataclass(frozen=True)
class TextConfig:
    prompt: str
    source: TopicConfig | None


@dataclass(frozen=True)
class ActionConfig:
    name: str
    key: str
    topic: str
    type_name: str
    qos: str
    sink: Any  # a Sink
    make_shaper: Callable[[], ActionShaper]  # one shaper (with its own hold state) per env
    start: int
    stop: int | None  # None: the whole action, as wide as the trainer sends it
    idle: str


@dataclass(frozen=True)
class RewardConfig:
    topic: str  # "" = no reward topic: every step earns 0
    type_name: str
    mode: str
    qos: str
    max_age_s: float
    sync: bool


@dataclass(frozen=True)
class EpisodeConfig:
    terminated_topic: str
    truncated_topic: str
    success_topic: str
    qos: str
    max_steps: int
    sync: bool  # the terminated/truncated topics publish once per action step


@dataclass(frozen=True)
class ResetService:
    """The reset service's type, how to make its request, and what its response says (by field path)."""

    srv_type: type  # the generated service class
    make_request: Callable[[], Any]  # a fresh request with the configured fields
    success: Any  # a FieldPath to the response's success flag (true: non-zero), or None: any answer is success
    message: Callable[[Any], str] | None  # the response's message, for the log on a failure


@dataclass(frozen=True)
class ResetConfig:
    mode: str
    service: str
    service_type: str
    timeout_s: float
    retry_initial_s: float
    retry_max_s: float
    ready_topic: str
    on_start: bool  # each trainer connection starts every env on a fresh episode
    call: ResetService | None = None  # mode service: what to call


@dataclass(frozen=True)
class ControlConfig:
    mode: str
    rate_hz: float
    replan_steps: int
    action_horizon: int
    action_dim: int
    feedback_deadline_s: float
    batch_window_s: float
    env_timeout_s: float
    wait_for_subscribers: bool

    @property
    def period_s(self) -> float:
        return 1.0 / self.rate_hz


@dataclass(frozen=True)
class PauseConfig:
    topic: str
    start_paused: bool
    max_age_s: float  # > 0: the topic is a dead-man switch (silence pauses)


@dataclass(frozen=True)
class InterventionConfig:
    """A person in the loop: where their command comes from and the rule that says they have taken over."""

    source: str  # joy (sensor_msgs/Joy axes) or actions (each actuator's own message type)
    takeover: str  # button, topic or fresh (plugrl_ros.robot.takeover)
    max_age_s: float
    qos: str
    topic: str  # the std_msgs/Bool deadman (takeover topic), else ""
    joy_topic: str  # the sensor_msgs/Joy topic (source joy or takeover button), else ""
    axes: tuple[int, ...]  # source joy: the axis of each action value [0, len(axes))
    scale: tuple[float, ...]
    offset: tuple[float, ...]
    button: int  # takeover button: the deadman's index in Joy.buttons
    action_topics: tuple[str, ...]  # source actions: one topic per actuator, in the order of ``actions``


@dataclass(frozen=True)
class StatusConfig:
    diagnostics_period_s: float
    log_period_s: float


@dataclass(frozen=True)
class BridgeConfig:
    mode: str  # train (a PlugRL trainer), deploy (a policy server) or teleop (a person)
    trainer: ClientSettings
    use_reuse: bool
    text_format: str
    envs: tuple[str, ...]
    control: ControlConfig
    images: tuple[ImageConfig, ...]
    states: tuple[StateConfig, ...]
    text: TextConfig
    actions: tuple[ActionConfig, ...]
    reward: RewardConfig
    episode: EpisodeConfig
    reset: ResetConfig
    pause: PauseConfig
    status: StatusConfig
    record: RecordSettings
    policy: PolicyConfig | None  # the policy section, if given (always in deploy mode)
    intervention: InterventionConfig | None = None  # a person in the loop, if the section is given

    @property
    def action_width_needed(self) -> int:
        """How many values per step the configured actions read (at least)."""
        return max(a.start + 1 if a.stop is None else a.stop for a in self.actions)

    @property
    def takes_whole_action(self) -> bool:
        """An actuator takes the whole action, however wide the trainer sends it (a multi-array without a slice)."""
        return any(a.stop is None for a in self.actions)

    def observation_topics(self) -> list[TopicConfig]:
        topics = [image.source for image in self.images]
        topics += [part for state in self.states for part in state.parts]
        if self.text.source is not None:
            topics.append(self.text.source)
        return topics


def is_ros_owned(name: str) -> bool:
    return any(name == p or name.startswith(p) for p in _ROS_OWNED_PREFIXES)


def load_config(flat: Mapping[str, Any], used: dict[str, Any] | None = None) -> BridgeConfig:
    """Parse the node's parameters (dotted names) into a :class:`BridgeConfig`; ConfigError on mistakes.

    ``used``, if given, receives every key read with the value the bridge runs with
    (given or default): what the node declares.
    """
    root = Section(nest({k: v for k, v in flat.items() if not is_ros_owned(k)}), "", used)
    root.check_known(ROOT_KEYS)
    if not root.names():
        raise ConfigError(
            "observations",
            {},
            "no bridge parameters arrived: give a params file whose node section ('/**' or 'plugrl_bridge') "
            "holds ros__parameters",
        )
    mode = root.str("mode")
    trainer = root.section("trainer")
    client = ClientSettings(
        uri=_uri(trainer),
        api_key_env=trainer.str("api_key_env"),
        ca_file=trainer.str("ca_file"),
        wait_for_next_run=trainer.bool("wait_for_next_run"),
        reconnect_initial_s=trainer.float("reconnect_initial_s"),
        reconnect_max_s=trainer.float("reconnect_max_s"),
        open_timeout_s=trainer.float("open_timeout_s"),
        max_frame_bytes=_frame_cap(trainer),
        first_answer_timeout_s=trainer.float("first_answer_timeout_s"),
        answer_timeout_s=trainer.float("answer_timeout_s"),
        tcp_timeout_s=trainer.float("tcp_timeout_s"),
    )
    if client.reconnect_max_s < client.reconnect_initial_s:
        raise ConfigError(trainer.key("reconnect_max_s"), client.reconnect_max_s, "must be >= reconnect_initial_s")
    use_reuse = trainer.bool("use_reuse")
    text_format = trainer.str("text_format")
    trainer.finish()

    envs = tuple(root.str_list("envs", nonempty=True))
    for i, ns in enumerate(envs):
        if ns.strip() != ns or any(c in ns for c in " \t~{}"):
            raise ConfigError(f"envs[{i}]", ns, "a namespace like 'robot1' or '/lab/robot1' (or '' for none)")
    if len(set(envs)) != len(envs):
        raise ConfigError("envs", list(envs), "namespaces must be unique")

    control = _control(root.section("control"))
    observations = root.section("observations", required=True)
    images = _images(observations.section("images"))
    states = _states(observations.section("states"))
    text = _text(observations.section("text"))
    observations.finish()
    if not images and not states:
        raise ConfigError("observations", {}, "configure at least one image or state")
    actions = _actions(root.section("actions", required=True), control.period_s)
    reward = _reward(root.section("reward"))
    episode = _episode(root.section("episode"))
    reset = _reset(root.section("reset"))
    pause_section = root.section("pause")
    pause = PauseConfig(
        topic=_topic(pause_section, "topic"),
        start_paused=pause_section.bool("start_paused"),
        max_age_s=pause_section.float("max_age_s"),
    )
    pause_section.finish()
    if pause.max_age_s > 0 and not pause.topic:
        raise ConfigError(pause_section.key("max_age_s"), pause.max_age_s, "a dead-man switch needs pause.topic")
    status_section = root.section("status")
    status = StatusConfig(
        diagnostics_period_s=status_section.float("diagnostics_period_s"),
        log_period_s=status_section.float("log_period_s"),
    )
    status_section.finish()
    record = parse_record_section(root.section("record"), ConfigError)
    policy = _policy(root, mode, images, states, text)
    if mode == "deploy" and control.mode != "timer":
        raise ConfigError("control.mode", control.mode, "deploy mode runs on the control timer: timer")
    intervention = _intervention(root.section("intervention"), control, actions) if root.has("intervention") else None
    if mode == "teleop" and intervention is None:
        raise ConfigError(
            "intervention.source", MISSING, "mode is teleop: give the intervention section (the person's device)"
        )
    root.finish()

    config = BridgeConfig(
        mode=mode,
        trainer=client,
        use_reuse=use_reuse,
        text_format=text_format,
        envs=envs,
        control=control,
        images=images,
        states=states,
        text=text,
        actions=actions,
        reward=reward,
        episode=episode,
        reset=reset,
        pause=pause,
        status=status,
        record=record,
        policy=policy,
        intervention=intervention,
    )
    if policy is not None:
        policy.expectation(min_width=config.action_width_needed)  # a too narrow policy.action_dim fails here
    _check_shared_topics(config)
    return config


def check_environment(config: BridgeConfig, environ: Mapping[str, str]) -> None:
    """What the mode's link names outside the configuration, checked at startup: the API key's variable, the CA file."""
    if config.mode == "deploy":
        assert config.policy is not None
        check_policy_environment(config.policy, environ)
        return  # the trainer section is not used
    if config.mode == "teleop":
        return  # no link at all
    problem = config.trainer.access_problem(environ)
    if problem is None:
        return
    setting, value, why = problem
    if setting == "api_key_env":
        why += ": export the key in it before starting the bridge, "
        why += 'or set api_key_env to "" for a trainer that needs no key'
    raise ConfigError(f"trainer.{setting}", value, why)


def _policy(
    root: Section, mode: str, images: tuple[ImageConfig, ...], states: tuple[StateConfig, ...], text: TextConfig
) -> PolicyConfig | None:
    """The policy section: required in deploy mode; checked whenever given, so one file serves both modes."""
    if not root.has("policy"):
        if mode == "deploy":
            raise ConfigError("policy.uri", None, "mode is deploy: give the policy section (uri, observations)")
        return None
    section = root.section("policy", required=True)
    sources = {f"images.{image.name}" for image in images} | {f"states.{state.name}" for state in states}
    if text.prompt or text.source is not None:
        sources.add("text")
    return load_policy_config(section.values(), sources, root.used, prefix=section.prefix)


def _frame_cap(section: Section) -> int | None:
    megabytes = section.float("max_frame_mb")
    if 0 < megabytes < 4:
        raise ConfigError(section.key("max_frame_mb"), megabytes, "0 (no limit) or at least 4 (metadata may be MiBs)")
    return int(megabytes * 2**20) if megabytes else None


def _uri(section: Section) -> str:
    uri = section.str("uri")
    if not uri.startswith(("ws://", "wss://")) or len(uri) <= len("wss://"):
        raise ConfigError(section.key("uri"), uri, "a ws:// or wss:// URI, e.g. ws://192.168.1.10:8000")
    return uri


def _topic(section: Section, name: str) -> str:
    topic = section.str(name)
    if topic and (any(c in topic for c in " \t{}") or topic.endswith("/")):
        raise ConfigError(section.key(name), topic, "a ROS topic name like 'joint_states' or '/camera/image_raw'")
    return topic


def _type_name(section: Section, name: str, choices: tuple[str, ...], kind: str) -> str:
    """An interface type among ``choices``, written "pkg/Type" or "pkg/<kind>/Type"."""
    value = short_type_name(section.str(name), kind)
    if value not in choices:
        raise ConfigError(section.key(name), section.str(name), f"allowed: {', '.join(choices)}")
    return value


def _qos(section: Section) -> str:
    return section.str("qos")


def _control(section: Section) -> ControlConfig:
    control = ControlConfig(
        mode=section.str("mode"),
        rate_hz=section.float("rate_hz"),
        replan_steps=section.int("replan_steps"),
        action_horizon=section.int("action_horizon"),
        action_dim=section.int("action_dim"),
        feedback_deadline_s=section.float("feedback_deadline_s"),
        batch_window_s=section.float("batch_window_s"),
        env_timeout_s=section.float("env_timeout_s"),
        wait_for_subscribers=section.bool("wait_for_subscribers"),
    )
    section.finish()
    return control


def _subscription(section: Section, make: Callable[[str, Section], Any]) -> TopicConfig:
    topic = _topic(section, "topic")
    type_name = section.str("type")
    qos = _qos(section)
    max_age_s = section.float("max_age_s")
    sync = section.bool("sync")
    converter = make(type_name, section)
    section.finish()
    return TopicConfig(section.prefix, topic, type_name, qos, max_age_s, converter, sync)


def _images(section: Section) -> tuple[ImageConfig, ...]:
    images = []
    for name in section.names():
        images.append(ImageConfig(name, _subscription(section.section(name), make_image_source)))
    section.finish()
    return tuple(images)


def _states(section: Section) -> tuple[StateConfig, ...]:
    states = []
    for name in section.names():
        state = section.section(name)
        if state.has("parts"):
            part_names = state.str_list("parts", nonempty=True)
            if len(set(part_names)) != len(part_names):
                raise ConfigError(state.key("parts"), part_names, "part names must be unique")
            parts = tuple(_subscription(state.section(part, required=True), make_state_source) for part in part_names)
            state.finish()
        else:
            parts = (_subscription(state, make_state_source),)
        states.append(StateConfig(name, parts))
    section.finish()
    return tuple(states)


def _text(section: Section) -> TextConfig:
    prompt = section.str("prompt")
    topic = _topic(section, "topic")
    source = None
    if topic:
        source = TopicConfig(
            section.key("topic"),
            topic,
            "std_msgs/String",
            _qos(section),
            section.float("max_age_s"),
            TextSource(),
            section.bool("sync"),
        )
        if prompt:
            raise ConfigError(section.key("prompt"), prompt, "give either a fixed prompt or a topic, not both")
    section.finish()
    return TextConfig(prompt=prompt, source=source)


def _actions(section: Section, period_s: float) -> tuple[ActionConfig, ...]:
    actions = []
    for name in section.names():
        action = section.section(name)
        topic = _topic(action, "topic")
        type_name = action.str("type")
        qos = _qos(action)
        sink = make_sink(type_name, action, period_s)
        shaper = ActionShaper.from_section(action, sink.width)
        action.finish()
        # the validated keys, to build one shaper (with its own hold state) per env
        make_shaper = functools.partial(_shaper, action.values(), action.prefix, sink.width)
        actions.append(
            ActionConfig(
                name, action.prefix, topic, type_name, qos, sink, make_shaper, shaper.start, shaper.stop, shaper.idle
            )
        )
    if not actions:
        raise ConfigError(section.prefix, {}, "configure at least one action sink")
    whole = [a for a in actions if a.stop is None]
    if whole and len(actions) > 1:
        raise ConfigError(
            f"{whole[0].key}.slice",
            MISSING,
            "a slice: without one this actuator takes the whole action, so it must be the only actuator",
        )
    section.finish()
    return tuple(actions)


def _shaper(values: dict, prefix: str, width: int | None) -> ActionShaper:
    return ActionShaper.from_section(Section(values, prefix), width)


def _reward(section: Section) -> RewardConfig:
    reward = RewardConfig(
        topic=_topic(section, "topic"),
        type_name=_type_name(section, "type", REWARD_TYPES, "msg"),
        mode=section.str("mode"),
        qos=_qos(section),
        max_age_s=section.float("max_age_s"),
        sync=section.bool("sync"),
    )
    section.finish()
    return reward


def _episode(section: Section) -> EpisodeConfig:
    episode = EpisodeConfig(
        terminated_topic=_topic(section, "terminated_topic"),
        truncated_topic=_topic(section, "truncated_topic"),
        success_topic=_topic(section, "success_topic"),
        qos=_qos(section),
        max_steps=section.int("max_steps"),
        sync=section.bool("sync"),
    )
    section.finish()
    return episode


def _reset_service(section: Section) -> ResetService:
    """Any service type: its request's fields from ``request`` (nested like the request), its response's
    success flag and message by field path (``success`` and ``message`` where the response has them)."""
    type_key = section.key("service_type")
    srv_type = interface_class(section.str("service_type"), "srv", type_key)
    if not hasattr(srv_type, "Request"):
        raise ConfigError(type_key, section.str("service_type"), "a service type (pkg/srv/Type)")
    make_request = message_factory(srv_type.Request, section.tree("request"), section.key("request"))
    response_fields = srv_type.Response.get_fields_and_field_types()
    success = None
    success_path = section.str("success_field")
    if success_path and (section.has("success_field") or success_path in response_fields):
        success = compile_path(srv_type.Response, success_path, section.key("success_field"))
        if success.width != 1:
            raise ConfigError(section.key("success_field"), success_path, "one boolean (or number) field")
    message = None
    message_path = section.str("message_field")
    if message_path and (section.has("message_field") or message_path in response_fields):
        message = string_reader(srv_type.Response, message_path, section.key("message_field"))
    return ResetService(srv_type, make_request, success, message)


def _reset(section: Section) -> ResetConfig:
    mode = section.str("mode")
    call = _reset_service(section)  # checked in every mode: a params file may switch it on with -p
    reset = ResetConfig(
        mode=mode,
        service=_topic(section, "service"),
        service_type=short_type_name(section.str("service_type"), "srv"),
        timeout_s=section.float("timeout_s"),
        retry_initial_s=section.float("retry_initial_s"),
        retry_max_s=section.float("retry_max_s"),
        ready_topic=_topic(section, "ready_topic"),
        on_start=section.bool("on_start"),
        call=call,
    )
    section.finish()
    if reset.mode == "service" and not reset.service:
        raise ConfigError(section.key("service"), reset.service, "reset.mode is service: name the reset service")
    if reset.mode == "signal" and not reset.ready_topic:
        raise ConfigError(section.key("ready_topic"), reset.ready_topic, "reset.mode is signal: name the ready topic")
    return reset


def _intervention(section: Section, control: ControlConfig, actions: tuple[ActionConfig, ...]) -> InterventionConfig:
    """The person in the loop: their command source and takeover rule, checked against the actuators."""
    source = section.str("source")
    takeover = section.str("takeover")
    max_age_s = section.float("max_age_s")
    qos = _qos(section)
    topic = _topic(section, "topic")
    if control.mode != "timer":
        raise ConfigError(
            section.key("source"), source, "interventions need control.mode timer (a person commands in real time)"
        )
    for action in actions:
        if action.stop is None:
            raise ConfigError(
                f"{action.key}.slice",
                MISSING,
                "a slice: with interventions the person's command is as wide as the actuators' slices say",
            )
        scale = action.make_shaper().scale
        if not np.all(scale != 0):
            # the person's command and what an actuator executed are mapped back through scale into the action
            raise ConfigError(
                f"{action.key}.scale", scale.tolist(), "non-zero values: interventions map commands back through it"
            )
    if takeover == "topic" and not topic:
        raise ConfigError(section.key("topic"), topic, "takeover is topic: name the std_msgs/Bool deadman topic")
    if takeover != "topic" and topic:
        raise ConfigError(section.key("topic"), topic, f"only read with takeover topic (takeover is {takeover})")
    uses_joy = source == "joy" or takeover == "button"
    joy = section.section("joy")
    if not uses_joy and joy.names():
        raise ConfigError(joy.prefix, joy.values(), "only read with source joy or takeover button")
    joy_topic = _topic(joy, "topic") if uses_joy else ""
    if uses_joy and not joy_topic:
        raise ConfigError(joy.key("topic"), joy_topic, "name the sensor_msgs/Joy topic")
    button = joy.int("button") if takeover == "button" else 0
    axes: tuple[int, ...] = ()
    scale: tuple[float, ...] = ()
    offset: tuple[float, ...] = ()
    width = max(a.stop or 0 for a in actions)
    if source == "joy":
        axes = tuple(joy.int_list("axes"))
        if len(axes) != width or any(axis < 0 for axis in axes):
            raise ConfigError(
                joy.key("axes"), list(axes), f"{width} axis indices (>= 0), one per action value the actuators read"
            )
        scale = tuple(joy.float_list("scale", length=width))
        offset = tuple(joy.float_list("offset", length=width))
    joy.finish()
    action_topics: tuple[str, ...] = ()
    commands = section.section("actions")
    if source == "actions":
        names = [a.name for a in actions]
        commands.check_known(names)
        action_topics = tuple(_topic(commands, name) for name in names)
        for name, command_topic in zip(names, action_topics, strict=True):
            if not command_topic:
                raise ConfigError(commands.key(name), command_topic, "the topic of this actuator's command")
    elif commands.names():
        raise ConfigError(commands.prefix, commands.values(), "only read with source actions")
    commands.finish()
    section.finish()
    return InterventionConfig(
        source=source,
        takeover=takeover,
        max_age_s=max_age_s,
        qos=qos,
        topic=topic,
        joy_topic=joy_topic,
        axes=axes,
        scale=scale,
        offset=offset,
        button=button,
        action_topics=action_topics,
    )


def _check_shared_topics(config: BridgeConfig) -> None:
    """With several envs, an absolute actuator or reward topic would be shared by all of them."""
    if len(config.envs) < 2:
        return
    per_env = [(a.key + ".topic", a.topic) for a in config.actions]
    per_env += [("reward.topic", config.reward.topic), ("episode.terminated_topic", config.episode.terminated_topic)]
    per_env += [("episode.truncated_topic", config.episode.truncated_topic)]
    if (person := config.intervention) is not None:
        # one person's device per robot: a shared one would take every robot over at once
        per_env += [("intervention.topic", person.topic), ("intervention.joy.topic", person.joy_topic)]
        per_env += [(f"intervention.actions.{a.name}", t) for a, t in zip(config.actions, person.action_topics)]
    for key, topic in per_env:
        if topic.startswith("/"):
            raise ConfigError(
                key, topic, f"an absolute topic would be shared by all {len(config.envs)} envs; use a relative name"
            )


def env_topic(namespace: str, topic: str) -> str:
    """``topic`` as seen by the env under ``namespace``: relative names resolve inside it."""
    if not namespace or topic.startswith("/"):
        return topic
    return f"{namespace.rstrip('/')}/{topic}"
