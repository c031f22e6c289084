"""``plugrl-record-info FILE...``: what a recording holds (envs, episodes, returns, steps, drops, link events).

A deploy-mode recording adds, per env, what became of the policy server's
answers (applied, stale, ...) and how many rows of an applied chunk had
passed when it arrived (its alignment).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from plugrl_ros.record import channels
from plugrl_ros.record.read import RecordingReader, in_written_order, labelled, values


@dataclass
class EnvSummary:
    chunks: int = 0
    steps: int = 0  # steps that ran a chunk's action or a person's command
    idle_steps: int = 0
    person_steps: int = 0  # with a person in the loop: the steps the person commanded
    last_step: tuple[int, bool] | None = None  # (sequence, idle) of the last step seen
    episodes: list[tuple[float, int, bool]] = field(default_factory=list)  # (return, length, success)
    answers: Counter = field(default_factory=Counter)  # deploy mode: outcome -> count
    first_rows: list[int] = field(default_factory=list)  # deploy mode: each applied chunk's first row run


@dataclass
class FileSummary:
    path: Path
    complete: bool
    problem: str


@dataclass
class Summary:
    files: list[FileSummary] = field(default_factory=list)
    messages: int = 0
    calls: int = 0
    dropped_calls: int = 0  # gaps in the call numbers
    recorder_dropped: int | None = None  # the recorder's own count, as last written
    first_t: int | None = None
    mode: str = ""  # the bridge's mode, from the configuration recorded at the start
    last_t: int | None = None
    envs: dict[int, EnvSummary] = field(default_factory=dict)
    link_events: list[tuple[int, str, dict]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)


def summarize(paths: list[Path]) -> Summary:
    """Read every file once and count."""
    summary = Summary()
    sequences: set[int] = set()
    for path in paths:
        reader = RecordingReader(path)
        for rec in reader:
            summary.messages += 1
            if rec.topic == channels.CONFIG_TOPIC and not summary.mode:
                summary.mode = str(json.loads(rec.msg.data).get("parameters", {}).get("mode", "train"))
            if rec.topic not in (channels.CONFIG_TOPIC, channels.RECORDER_TOPIC):
                sequences.add(rec.sequence)
                summary.first_t = rec.log_time if summary.first_t is None else min(summary.first_t, rec.log_time)
                summary.last_t = rec.log_time if summary.last_t is None else max(summary.last_t, rec.log_time)
            per_env = channels.split_env_topic(rec.topic)
            if per_env is not None:
                env, rest = per_env
                stats = summary.envs.setdefault(env, EnvSummary())
                if rest == "action_chunk":
                    stats.chunks += 1
                elif rest == "step":
                    idle = bool(labelled(rec.msg)["idle"])
                    stats.last_step = (rec.sequence, idle)
                    if idle:
                        stats.idle_steps += 1
                    else:
                        stats.steps += 1
                elif rest == channels.INTERVENTION and labelled(rec.msg)["person"]:
                    if stats.last_step != (rec.sequence, True):
                        stats.person_steps += 1  # the person commanded a step a chunk would have run
                    elif summary.mode == "teleop":  # no chunk runs in teleop mode: every command is a step
                        stats.person_steps += 1
                        stats.idle_steps -= 1
                        stats.steps += 1
                    # else the person drove between chunks: an idle tick, not a step of the episode (as the
                    # bridge counts them, and the trainer sees them)
                elif rest == "episode":
                    ep = labelled(rec.msg)
                    stats.episodes.append((ep["return"], int(ep["length"]), bool(ep["success"])))
                elif rest == channels.ANSWER:
                    stats.answers[rec.msg.message] += 1
                    first_row = values(rec.msg).get("first_row")
                    if first_row is not None:
                        stats.first_rows.append(int(first_row))
            elif rec.topic == channels.LINK_EVENT_TOPIC:
                summary.link_events.append((rec.log_time, rec.msg.message, values(rec.msg)))
            elif rec.topic == channels.LATENCY_TOPIC:
                summary.latencies.append(rec.msg.data)
            elif rec.topic == channels.RECORDER_TOPIC:
                summary.recorder_dropped = int(values(rec.msg)["dropped"])
        summary.files.append(FileSummary(path, reader.complete, reader.problem))
    summary.calls = len(sequences)
    if sequences:
        summary.dropped_calls = max(sequences) - min(sequences) + 1 - len(sequences)
    return summary


def _returns(episodes: list[tuple[float, int, bool]]) -> str:
    if not episodes:
        return "no episode ended"
    rets = [r for r, _, _ in episodes]
    successes = sum(1 for _, _, s in episodes if s)
    return (
        f"return mean {statistics.fmean(rets):.4g} (min {min(rets):.4g}, max {max(rets):.4g}), "
        f"length mean {statistics.fmean(n for _, n, _ in episodes):.4g}, success {successes}/{len(episodes)}"
    )


def _short(value: object) -> str:
    """A value on one line: a long text (a server's traceback) by its last line."""
    text = str(value)
    if "\n" in text or len(text) > 120:
        last = text.strip().splitlines()[-1] if text.strip() else ""
        return f"...{last[-120:]!r}"
    return text


def format_summary(summary: Summary) -> str:
    lines = []
    for f in summary.files:
        lines.append(f"file: {f.path} ({'complete' if f.complete else 'cut off'})")
        if f.problem:
            lines.append(f"  {f.problem}")
    span = 0.0
    if summary.first_t is not None and summary.last_t is not None:
        span = (summary.last_t - summary.first_t) / 1e9
    lines.append(f"duration: {span:.3f} s   messages: {summary.messages}   recorder calls: {summary.calls}")
    reported = "" if summary.recorder_dropped is None else f" (the recorder's own count: {summary.recorder_dropped})"
    lines.append(f"dropped calls: {summary.dropped_calls}{reported}")
    if summary.mode:
        lines.append(f"mode: {summary.mode}" + (" (a policy server's chunks)" if summary.mode == "deploy" else ""))
    lines.append(f"envs: {len(summary.envs)}")
    for env, s in sorted(summary.envs.items()):
        lines.append(
            f"  env {env}: episodes {len(s.episodes)}, steps {s.steps} (+{s.idle_steps} idle), chunks {s.chunks}; "
            f"{_returns(s.episodes)}"
        )
        if s.person_steps:
            lines.append(f"    a person commanded {s.person_steps} of the steps ({s.person_steps / s.steps:.0%})")
        if s.episodes:
            shown = ", ".join(f"{r:.4g}" for r, _, _ in s.episodes[:20])
            more = f", ... ({len(s.episodes) - 20} more)" if len(s.episodes) > 20 else ""
            lines.append(f"    returns: {shown}{more}")
        if s.answers:
            outcomes = ", ".join(f"{k} {n}" for k, n in sorted(s.answers.items()))
            line = f"    answers: {sum(s.answers.values())} ({outcomes})"
            if s.first_rows:
                line += (
                    f"; applied from row {statistics.fmean(s.first_rows):.2f} on average "
                    f"(max {max(s.first_rows)}; rows before it were meant for ticks that had passed)"
                )
            lines.append(line)
    kinds = Counter(kind for _, kind, _ in summary.link_events)
    by_kind = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    lines.append(f"link events: {len(summary.link_events)}" + (f" ({by_kind})" if kinds else ""))
    for t, kind, vals in summary.link_events:
        if kind != "metadata":
            detail = ", ".join(f"{k}={_short(v)}" for k, v in vals.items())
            lines.append(f"  {(t - (summary.first_t or t)) / 1e9:9.3f} s  {kind}: {detail}")
    if summary.latencies:
        ordered = sorted(summary.latencies)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        lines.append(
            f"latency: {len(ordered)} requests, "
            f"median {statistics.median(ordered) * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="plugrl-record-info", description="Summarize plugrl_ros MCAP recordings.")
    parser.add_argument("files", nargs="+", type=Path, help="MCAP files (a run's parts: read in the order written)")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    print(format_summary(summarize(in_written_order(args.files))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
